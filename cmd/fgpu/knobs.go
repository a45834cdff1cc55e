package main

import (
	"encoding"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// knobs names what --knobs may set: fgpu's options and its ablations
// (docs/placement.md, "Knobs").
func knobs(o *placement.Options, a *placement.Ablations) map[string]any {
	return map[string]any{
		"CPUSlack":  &o.CPUSlack,
		"MixReach":  &o.MixReach,
		"PackPrice": &o.PackPrice,

		"NoSigmoid":  &a.NoSigmoid,
		"Scale":      &a.Scale,
		"ScaleFrac":  &a.ScaleFrac,
		"Levels":     &a.Levels,
		"SigRound":   &a.SigRound,
		"Resolution": &a.Resolution,

		"Random":   &a.Random,
		"TieOrder": &a.TieOrder,
		"TieLeft":  &a.TieLeft,
		"TieType":  &a.TieType,
		"TieWhole": &a.TieWhole,

		"DemandWeighted": &a.DemandWeighted,
		"MultiBoost":     &a.MultiBoost,
		"NoCPUReach":     &a.NoCPUReach,
		"ReachGuard":     &a.ReachGuard,
		"MixSplit":       &a.MixSplit,
		"MixReachLo":     &a.MixReachLo,
		"MixReachHi":     &a.MixReachHi,

		"NoPackNode": &a.NoPackNode,
		"NoPackCPU":  &a.NoPackCPU,

		"Reserve":      &a.Reserve,
		"ReserveAbove": &a.ReserveAbove,
		"ReserveRatio": &a.ReserveRatio,
	}
}

// setKnobs sets fgpu's options and ablations from "Name=value,Name=value".
func setKnobs(o *placement.Options, a *placement.Ablations, spec string) error {
	known := knobs(o, a)
	for _, kv := range strings.Split(spec, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("--knobs: %q is not Name=value", kv)
		}
		var err error
		switch p := known[name].(type) {
		case *bool:
			*p, err = strconv.ParseBool(val)
		case *float64:
			*p, err = strconv.ParseFloat(val, 64)
		case *int64:
			*p, err = strconv.ParseInt(val, 10, 64)
		case encoding.TextUnmarshaler:
			err = p.UnmarshalText([]byte(val))
		default:
			names := make([]string, 0, len(known))
			for n := range known {
				names = append(names, n)
			}
			slices.Sort(names)
			return fmt.Errorf("--knobs: no knob %q (known: %s)", name, strings.Join(names, ", "))
		}
		if err != nil {
			return fmt.Errorf("--knobs: %s: %w", name, err)
		}
	}
	return nil
}
