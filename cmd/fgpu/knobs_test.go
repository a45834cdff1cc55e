package main

import (
	"reflect"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

func TestSetKnobs(t *testing.T) {
	o, a := placement.DefaultOptions(), placement.Ablations{}
	if err := setKnobs(&o, &a, "MixReach=0, ReserveRatio=3,TieWhole=whole,ReserveAbove=true,MixSplit=500,ReachGuard=any,NoPackNode=true"); err != nil {
		t.Fatal(err)
	}
	if o.MixReach != 0 || o.CPUSlack != placement.DefaultOptions().CPUSlack {
		t.Fatalf("options not set: %+v", o)
	}
	want := placement.Ablations{ReserveRatio: 3, TieWhole: placement.TieWholeWhole, ReserveAbove: true, MixSplit: 500,
		ReachGuard: placement.ReachGuardAny, NoPackNode: true}
	if a != want {
		t.Fatalf("ablations %+v, want %+v", a, want)
	}
	for _, bad := range []string{"NoSuchKnob=1", "TieWhole", "TieWhole=x", "TieWhole=2", "res=1", "MixSplit=0.5", "NoSigmoid=maybe"} {
		o, a := placement.DefaultOptions(), placement.Ablations{}
		if err := setKnobs(&o, &a, bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Every option and ablation has its own knob: the knobs point at distinct
// fields, as many as the two structs have.
func TestKnobsCoverEveryField(t *testing.T) {
	var o placement.Options
	var a placement.Ablations
	k := knobs(&o, &a)
	seen := map[any]string{}
	for name, p := range k {
		if other, dup := seen[p]; dup {
			t.Errorf("%s and %s set the same field", name, other)
		}
		seen[p] = name
	}
	if n := reflect.TypeOf(o).NumField() + reflect.TypeOf(a).NumField(); len(k) != n {
		t.Errorf("%d knobs for %d fields", len(k), n)
	}
}
