package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fgpu-dev/fgpu/pkg/placement/drabench"
)

func newBenchCmd() *cobra.Command {
	var sizes, fills, output string
	var share int64
	var iters int
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Time one placement decision: fgpu vs the upstream DRA structured allocator",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ns, err := parseInts(sizes)
			if err != nil {
				return err
			}
			fs, err := parseFloats(fills)
			if err != nil {
				return err
			}
			var out []*drabench.Result
			w := cmd.OutOrStdout()
			if output == "table" {
				fmt.Fprintf(w, "%8s %5s %12s %14s %10s %9s\n", "nodes", "fill", "fgpu us", "upstream us", "ratio", "feasible")
			}
			for _, n := range ns {
				for _, f := range fs {
					r, err := drabench.Run(n, f, share, iters, 1)
					if err != nil {
						return err
					}
					out = append(out, r)
					if output == "table" {
						fmt.Fprintf(w, "%8d %5.2f %12.1f %14.1f %9.0fx %4d/%-4d\n", r.Nodes, r.Fill, r.FgpuUs, r.UpstreamUs, r.Ratio, r.FgpuFits, r.Feasible)
					}
				}
			}
			if output == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&sizes, "nodes", "100,1000,10000", "cluster sizes (nodes of 8 GPUs)")
	cmd.Flags().StringVar(&fills, "fill", "0.5,0.9", "GPU fill fractions")
	cmd.Flags().Int64Var(&share, "share", 300, "the new claim's share of one GPU, milli")
	cmd.Flags().IntVar(&iters, "iters", 50, "decisions timed per side (upstream stops after 20 s)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("bad number %q", p)
		}
		out = append(out, v)
	}
	return out, nil
}

func parseFloats(s string) ([]float64, error) {
	var out []float64
	for _, p := range strings.Split(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v >= 1 {
			return nil, fmt.Errorf("bad fill %q (0 <= fill < 1)", p)
		}
		out = append(out, v)
	}
	return out, nil
}
