package model

import (
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// placed is a share of a preemptionModel, on gpu-<device>.
type placed struct {
	device int
	t      Tenant
}

func on(device int, tn Tenant) placed { return placed{device, tn} }

// preemptionModel is a model of four 80Gi GPUs on n1 (gpu-3 unpublished when lost is set)
// with the given shares, each its own claim ("<namespace>/<i>").
func preemptionModel(t *testing.T, lost bool, shares ...placed) *Model {
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
	if lost {
		delete(devs, "gpu-3")
		m.SetNodeDevices("n1", devs)
	}
	return m
}

func sharing(ns string, mem int64) Tenant {
	return Tenant{Namespace: ns, Mem: mem, AllowShare: true, Mode: api.SharingModeMPS, Latency: api.LatencyStandard, Domain: Domain{Namespace: ns}}
}

// Which GPUs may be taken back: those whose every share fits beside its own namespace's
// shares on another published GPU, by room and by the co-tenancy rules, and lets namespaces
// granted allowSharedGPU in; never a GPU of the asking namespace, one to avoid, or a share
// movable refuses.
func TestPreemptible(t *testing.T) {
	critical := func(ns string) Tenant {
		tn := sharing(ns, gi)
		tn.Latency, tn.MaxCo = api.LatencyCritical, 1
		return tn
	}
	isolated := sharing("a", gi)
	isolated.AllowShare = false
	for name, tc := range map[string]struct {
		lost    bool
		shares  []placed
		avoid   string
		refuse  string // namespace movable refuses
		want    []string
		besides map[string]string // GPU taken back -> where its first share fits
	}{
		"one small share per GPU": {shares: []placed{on(0, sharing("a", gi)), on(1, sharing("a", gi)), on(2, sharing("a", gi))},
			want: []string{"gpu-0", "gpu-1", "gpu-2"}, besides: map[string]string{"gpu-0": "gpu-1", "gpu-1": "gpu-0", "gpu-2": "gpu-0"}},
		"packed":                               {shares: []placed{on(0, sharing("a", gi)), on(0, sharing("a", gi))}},
		"too large to fit beside":              {shares: []placed{on(0, sharing("a", 50*gi)), on(1, sharing("a", 50*gi))}},
		"the larger cannot move":               {shares: []placed{on(0, sharing("a", 60*gi)), on(1, sharing("a", 30*gi)), on(2, sharing("a", 30*gi))}, want: []string{"gpu-1", "gpu-2"}},
		"full beside another's shares":         {shares: []placed{on(0, sharing("b", 40*gi)), on(0, sharing("c", 40*gi)), on(1, sharing("b", 40*gi)), on(1, sharing("c", 40*gi))}},
		"critical without critical co-tenants": {shares: []placed{on(0, critical("a")), on(1, critical("a"))}},
		"an honest co-tenant stays":            {shares: []placed{on(0, sharing("a", gi)), on(0, sharing("b", gi)), on(1, sharing("a", gi))}, want: []string{"gpu-1"}},
		"a charged GPU is not taken":           {shares: []placed{on(0, isolated), on(1, sharing("a", gi))}, want: []string{"gpu-1"}},
		"not the asking namespace's":           {shares: []placed{on(0, sharing("ask", gi)), on(1, sharing("ask", gi))}},
		"avoided, as GPU and as room":          {shares: []placed{on(0, sharing("a", gi)), on(1, sharing("a", gi))}, avoid: "gpu-1"},
		"movable refuses":                      {shares: []placed{on(0, sharing("a", gi)), on(1, sharing("a", gi))}, refuse: "a"},
		"a lost GPU is no room":                {lost: true, shares: []placed{on(0, sharing("a", gi)), on(3, sharing("a", gi))}},
	} {
		m := preemptionModel(t, tc.lost, tc.shares...)
		var got []string
		besides := map[string]string{}
		m.Update(func(tx *Tx) {
			ps, _ := tx.Preemptible("ask", func(g *GPU) bool { return g.key.Device == tc.avoid },
				func(t *Tenant) bool { return t.Namespace != tc.refuse }, 0, 10)
			for _, p := range ps {
				got = append(got, p.GPU.key.Device)
				for t := range p.GPU.Tenants() {
					besides[p.GPU.key.Device] = p.Moves[t.ShareID].key.Device
				}
			}
		})
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: preemptible %v, want %v", name, got, tc.want)
		}
		for g, want := range tc.besides {
			if besides[g] != want {
				t.Errorf("%s: %s's share fits beside %s, want %s", name, g, besides[g], want)
			}
		}
	}
}

// Without takes claims out for a what-if and puts them back as they were.
func TestWithout(t *testing.T) {
	m := preemptionModel(t, false, on(0, sharing("a", gi)), on(1, sharing("a", 2*gi)))
	m.Update(func(tx *Tx) {
		before := tx.Charged("a")
		tx.Without([]string{"a/0", "a/0", "missing"}, func() {
			if g, _ := tx.GPU(GPUKey{Pool: "n1", Device: "gpu-0"}); g.NumTenants() != 0 {
				t.Error("gpu-0 keeps its share inside Without")
			}
			if got := tx.Charged("a"); got.Mem != 2*gi {
				t.Errorf("charged %v inside Without", got)
			}
		})
		if g, _ := tx.GPU(GPUKey{Pool: "n1", Device: "gpu-0"}); g.NumTenants() != 1 || tx.Charged("a") != before {
			t.Errorf("after Without: %d tenants on gpu-0, charged %v (was %v)", g.NumTenants(), tx.Charged("a"), before)
		}
	})
}

// Preemptible returns at most max GPUs, and the next call looks on from where it stopped,
// round to the start.
func TestPreemptibleLooksOnFromWhereItStopped(t *testing.T) {
	m := preemptionModel(t, false, on(0, sharing("a", gi)), on(1, sharing("a", gi)), on(2, sharing("a", gi)), on(3, sharing("a", gi)))
	none := func(*GPU) bool { return false }
	all := func(*Tenant) bool { return true }
	var got []string
	from := 0
	m.Update(func(tx *Tx) {
		for range 3 {
			var ps []Preemptible
			ps, from = tx.Preemptible("ask", none, all, from, 3)
			for _, p := range ps {
				got = append(got, p.GPU.key.Device)
			}
		}
	})
	if want := "[gpu-0 gpu-1 gpu-2 gpu-3 gpu-0 gpu-1 gpu-2 gpu-3 gpu-0]"; fmt.Sprint(got) != want {
		t.Errorf("three calls of 3 over 4 GPUs: %v, want %s", got, want)
	}
}
