package model

import (
	"fmt"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// spreadModel is a model of four 80Gi GPUs on n1 with the given shares, each its own claim
// ("<namespace>/<i>") on gpu-<device>.
func spreadModel(t *testing.T, shares ...placed) *Model {
	t.Helper()
	m := New(api.DriverName)
	devs := map[string]resourceapi.Device{}
	for i := range 4 {
		name := fmt.Sprintf("gpu-%d", i)
		devs[name] = gpu80(name)
	}
	m.SetNodeDevices("n1", devs)
	m.Update(func(tx *Tx) {
		for i, s := range shares {
			g, _ := tx.GPU(GPUKey{Pool: "n1", Device: fmt.Sprintf("gpu-%d", s.device)})
			tn := s.t
			tn.Key, tn.ShareID, tn.Claim = fmt.Sprintf("%s/%d", tn.Namespace, i), types.UID(fmt.Sprint(i)), types.UID(fmt.Sprint(i))
			c := NewClaim(tn.Claim, tn.Key, tn.Namespace, time.Time{})
			c.AddShare(g, &tn)
			tx.Add(c)
		}
	})
	return m
}

// placed is a share of a spreadModel.
type placed struct {
	device int
	t      Tenant
}

func on(device int, tn Tenant) placed { return placed{device, tn} }

func sharing(ns string, mem, comp int64) Tenant {
	return Tenant{Namespace: ns, Mem: mem, Comp: comp, AllowShare: true, Mode: api.SharingModeMPS, Latency: api.LatencyStandard,
		Domain: Domain{Namespace: ns}}
}

// How many GPUs a namespace holds beyond what its shares need: only GPUs where its shares let
// in namespaces granted allowSharedGPU count (others are charged as held room), and the need
// is its shares packed by memory and compute, within their co-tenant limits.
func TestSpread(t *testing.T) {
	critical := func(ns string, mem int64) Tenant {
		tn := sharing(ns, mem, 0)
		tn.Latency, tn.MaxCo = api.LatencyCritical, 3
		return tn
	}
	isolated := sharing("a", gi, 0)
	isolated.AllowShare = false
	for name, tc := range map[string]struct {
		shares []placed
		want   Spread
	}{
		"one small share per GPU":       {[]placed{on(0, sharing("a", gi, 0)), on(1, sharing("a", gi, 0)), on(2, sharing("a", gi, 0)), on(3, sharing("a", gi, 0))}, Spread{On: 4, Need: 1}},
		"packed":                        {[]placed{on(0, sharing("a", gi, 0)), on(0, sharing("a", gi, 0))}, Spread{On: 1, Need: 1}},
		"shares too large to pack":      {[]placed{on(0, sharing("a", 50*gi, 0)), on(1, sharing("a", 50*gi, 0))}, Spread{On: 2, Need: 2}},
		"compute too large to pack":     {[]placed{on(0, sharing("a", gi, 51)), on(1, sharing("a", gi, 51))}, Spread{On: 2, Need: 2}},
		"beside another namespace":      {[]placed{on(0, sharing("a", gi, 0)), on(0, sharing("b", 70*gi, 0)), on(1, sharing("a", gi, 0))}, Spread{On: 2, Need: 1}},
		"a charged GPU does not count":  {[]placed{on(0, sharing("a", gi, 0)), on(1, isolated)}, Spread{On: 1, Need: 1}},
		"within a co-tenant limit":      {[]placed{on(0, critical("a", gi)), on(1, critical("a", gi)), on(2, critical("a", gi)), on(3, critical("a", gi)), on(3, sharing("a", gi, 0))}, Spread{On: 4, Need: 2}},
		"larger and smaller, first fit": {[]placed{on(0, sharing("a", 60*gi, 0)), on(1, sharing("a", 30*gi, 0)), on(2, sharing("a", 20*gi, 0)), on(3, sharing("a", 10*gi, 0))}, Spread{On: 4, Need: 2}},
	} {
		m := spreadModel(t, tc.shares...)
		var got Spread
		m.Update(func(tx *Tx) { got = tx.Spread("a") })
		if got != tc.want {
			t.Errorf("%s: spread %+v, want %+v", name, got, tc.want)
		}
	}
}

// Preemptible GPUs: those only spread namespaces' shares hold, not the asking namespace's, less
// those already being taken back; Without takes claims out for what-if and puts them back.
func TestPreemptibleAndWithout(t *testing.T) {
	m := spreadModel(t, on(0, sharing("a", gi, 0)), on(1, sharing("a", gi, 0)), on(2, sharing("a", gi, 0)),
		on(2, sharing("honest", gi, 0)), on(3, sharing("b", gi, 0)))
	names := func(gs []*GPU) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.Key().Device)
		}
		return out
	}
	m.Update(func(tx *Tx) {
		// a is spread over three GPUs (needs one); the honest namespace and b are not.
		if got := names(tx.Preemptible("b", nil)); !slices.Equal(got, []string{"gpu-0", "gpu-1"}) {
			t.Errorf("preemptible for b: %v, want gpu-0 and gpu-1 (gpu-2 has an honest tenant)", got)
		}
		if got := tx.Preemptible("a", nil); len(got) != 0 {
			t.Errorf("preemptible for a itself: %v", names(got))
		}
		if got := tx.Preemptible("b", map[string]int{"a": 2}); len(got) != 0 {
			t.Errorf("preemptible with a's excess taken already: %v", names(got))
		}
		before := tx.Charged("a")
		tx.Without([]string{"a/0", "a/1"}, func() {
			if s := tx.Spread("a"); s != (Spread{On: 1, Need: 1}) {
				t.Errorf("without two of its claims a's spread is %+v", s)
			}
			if g, _ := tx.GPU(GPUKey{Pool: "n1", Device: "gpu-0"}); g.NumTenants() != 0 {
				t.Error("gpu-0 keeps its tenant inside Without")
			}
		})
		if tx.Charged("a") != before || tx.Spread("a") != (Spread{On: 3, Need: 1}) {
			t.Errorf("after Without: charged %v (was %v), spread %+v", tx.Charged("a"), before, tx.Spread("a"))
		}
	})
}
