package main

import (
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

func TestSetKnobs(t *testing.T) {
	p := placement.NewFGPU(nil)
	if err := setKnobs(p, "MixReach=0, ReserveRatio=3,TieWhole=2,ReserveAbove=true,MixSplit=500"); err != nil {
		t.Fatal(err)
	}
	if p.MixReach != 0 || p.MixSplit != 500 || p.ReserveRatio != 3 || p.TieWhole != 2 || !p.ReserveAbove {
		t.Fatalf("knobs not set: %+v", p)
	}
	for _, bad := range []string{"NoSuchKnob=1", "TieWhole", "TieWhole=x", "res=1"} {
		if err := setKnobs(placement.NewFGPU(nil), bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
