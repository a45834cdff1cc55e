package model

import (
	"testing"

	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

const gi = int64(1) << 30

// The held room's arithmetic: every GPU kept but the roomiest is charged, per resource; a
// GPU's room changing or its keeping ending moves the charge, ties included.
func TestHeldRoomCharge(t *testing.T) {
	g := func(name string) *GPU { return &GPU{key: GPUKey{Pool: "n1", Device: name}} }
	a, b, c, d := g("a"), g("b"), g("c"), g("d")
	h := HeldRoom{rooms: map[*GPU]Usage{}}
	h.add(a, Usage{Mem: 70 * gi, Comp: 90})
	h.add(b, Usage{Mem: 70 * gi, Comp: 10})
	h.add(c, Usage{Mem: 20 * gi, Comp: 50})
	if got, want := h.Charge(), (Usage{Mem: 90 * gi, Comp: 60}); got != want {
		t.Fatalf("charge %v, want %v", got, want)
	}
	for name, tc := range map[string]struct {
		g    *GPU
		r    Usage
		kept bool
		want Usage
	}{
		"a tie for the roomiest loses room":  {a, Usage{Mem: 60 * gi, Comp: 90}, true, Usage{Mem: 80 * gi, Comp: 60}},
		"the roomiest in compute fills":      {a, Usage{Mem: 70 * gi, Comp: 0}, true, Usage{Mem: 90 * gi, Comp: 10}},
		"a GPU no longer kept":               {c, Usage{Mem: 20 * gi, Comp: 50}, false, Usage{Mem: 70 * gi, Comp: 10}},
		"a new GPU with less room":           {d, Usage{Mem: 10 * gi, Comp: 5}, true, Usage{Mem: 100 * gi, Comp: 65}},
		"a new roomier GPU frees the last":   {d, Usage{Mem: 80 * gi, Comp: 100}, true, Usage{Mem: 160 * gi, Comp: 150}},
		"a GPU not kept changes nothing":     {d, Usage{Mem: 80 * gi, Comp: 100}, false, Usage{Mem: 90 * gi, Comp: 60}},
		"the only roomiest GPU fills up":     {c, Usage{Mem: 0, Comp: 0}, true, Usage{Mem: 70 * gi, Comp: 10}},
		"the GPU with least compute leaves":  {b, Usage{}, false, Usage{Mem: 20 * gi, Comp: 50}},
		"unchanged room, unchanged charge":   {b, Usage{Mem: 70 * gi, Comp: 10}, true, Usage{Mem: 90 * gi, Comp: 60}},
		"a kept GPU takes the whole of room": {b, Usage{Mem: 0, Comp: 0}, true, Usage{Mem: 20 * gi, Comp: 50}},
	} {
		if got := h.ChargeWith(tc.g, tc.r, tc.kept); got != tc.want {
			t.Errorf("%s: charge %v, want %v", name, got, tc.want)
		}
	}
}

// Who keeps a GPU from other namespaces: an isolated domain, time-slicing, a whole GPU, a
// burst, and the co-tenant limits once reached; not a share that allows others in.
func TestKeptBy(t *testing.T) {
	shared := func(ns string) *Tenant {
		return &Tenant{Namespace: ns, AllowShare: true, Mode: api.SharingModeMPS, Latency: api.LatencyStandard}
	}
	with := func(f func(*Tenant)) *Tenant { t := shared("a"); f(t); return t }
	for name, tc := range map[string]struct {
		tenants []*Tenant
		kept    bool
	}{
		"shared MPS":                     {[]*Tenant{shared("a")}, false},
		"isolated":                       {[]*Tenant{with(func(t *Tenant) { t.AllowShare = false })}, true},
		"time-sliced":                    {[]*Tenant{with(func(t *Tenant) { t.Mode = api.SharingModeTimeSlicing })}, true},
		"whole":                          {[]*Tenant{with(func(t *Tenant) { t.Whole = true })}, true},
		"bursting":                       {[]*Tenant{with(func(t *Tenant) { t.BurstCap = gi })}, true},
		"critical with room":             {[]*Tenant{with(func(t *Tenant) { t.Latency, t.MaxCo = api.LatencyCritical, 1 })}, false},
		"critical at maxCoTenants":       {[]*Tenant{with(func(t *Tenant) { t.Latency, t.MaxCo = api.LatencyCritical, 1 }), shared("b")}, true},
		"maxTenantsPerGPU with room":     {[]*Tenant{with(func(t *Tenant) { t.MaxTenants = 3 }), shared("b")}, false},
		"maxTenantsPerGPU reached":       {[]*Tenant{with(func(t *Tenant) { t.MaxTenants = 2 }), shared("b")}, true},
		"another namespace's time-slice": {[]*Tenant{shared("a"), func() *Tenant { t := shared("b"); t.Mode = api.SharingModeTimeSlicing; return t }()}, false},
	} {
		g := &GPU{tenants: map[types.UID]*Tenant{}}
		for i, t := range tc.tenants {
			g.tenants[types.UID(rune('0'+i))] = t
		}
		if got := g.KeptBy("a", nil); got != tc.kept {
			t.Errorf("%s: kept by a %v, want %v", name, got, tc.kept)
		}
	}
}
