package placement

import (
	"math"
	"math/rand"
	"testing"
)

// Equal scores go to the smallest node name for the deterministic policies
// (the FGD artifact's scheduler), whatever the node order.
func TestTiesGoToSmallestName(t *testing.T) {
	specs := []NodeSpec{
		{Name: "n2", CPUMilli: 32000, MemoryMiB: 1 << 20, GPUs: gpus("T4", 2)},
		{Name: "n0", CPUMilli: 32000, MemoryMiB: 1 << 20, GPUs: gpus("T4", 2)},
		{Name: "n1", CPUMilli: 32000, MemoryMiB: 1 << 20, GPUs: gpus("T4", 2)},
	}
	w := Workload{{CPUMilli: 1000, GPUs: 1, Share: 1000, Weight: 1}}
	for _, name := range []string{"fgd", "fgpu", "bestfit"} {
		c, _ := NewCluster(specs)
		pol, _ := New(name, w)
		s := NewScheduler(c, pol, 1)
		p, err := s.Place(&Request{CPUMilli: 1000, GPUs: 1})
		if err != nil || p.NodeName != "n0" {
			t.Errorf("%s: placed on %q (%v), want n0", name, p.NodeName, err)
		}
	}
}

// AllocateBatch undoes every trial: the cluster ends exactly as if the
// returned placements alone had been assigned, the policy's cached
// fragmentation matches a recomputation.
func TestAllocateBatchLeavesConsistentState(t *testing.T) {
	specs := make([]NodeSpec, 12)
	for i := range specs {
		specs[i] = NodeSpec{Name: string(rune('a' + i)), CPUMilli: 48000, MemoryMiB: 1 << 20, GPUs: gpus("A", 1+i%8)}
	}
	w := Workload{
		{CPUMilli: 4000, GPUs: 1, Share: 300, Weight: 0.3},
		{CPUMilli: 8000, GPUs: 1, Share: 700, Weight: 0.2},
		{CPUMilli: 12000, GPUs: 1, Share: 1000, Weight: 0.3},
		{CPUMilli: 24000, GPUs: 4, Share: 1000, Weight: 0.1},
		{CPUMilli: 6000, Weight: 0.1},
	}
	rng := rand.New(rand.NewSource(3))
	var reqs []*Request
	for i := 0; i < 80; i++ {
		s := w[rng.Intn(len(w))]
		r := &Request{CPUMilli: s.CPUMilli, GPUs: s.GPUs}
		if s.Share < 1000 {
			r.Share = s.Share
		}
		reqs = append(reqs, r)
	}
	c, _ := NewCluster(specs)
	pol := NewFGPU(w, DefaultOptions())
	s := NewScheduler(c, pol, 1)
	ref, _ := NewCluster(specs)
	for start := 0; start < len(reqs); start += 16 {
		batch := reqs[start:min(start+16, len(reqs))]
		pl, errs := s.AllocateBatch(batch, 6)
		for i, r := range batch {
			if errs[i] != nil {
				if reason(errs[i]) == 0 {
					t.Fatalf("unexpected error %v", errs[i])
				}
				continue
			}
			if err := ref.Assign(pl[i], r); err != nil {
				t.Fatalf("placement %d does not replay: %v", i, err)
			}
		}
	}
	for n := 0; n < c.Len(); n++ {
		cf, cm := c.FreeCPU(n)
		rf, rm := ref.FreeCPU(n)
		g1, _ := c.GPUs(n)
		g2, _ := ref.GPUs(n)
		if cf != rf || cm != rm {
			t.Fatalf("node %d CPU %d/%d vs replay %d/%d", n, cf, cm, rf, rm)
		}
		for g := range g1 {
			if g1[g] != g2[g] {
				t.Fatalf("node %d GPU %d: %d free vs replay %d", n, g, g1[g], g2[g])
			}
		}
	}
	var fresh float64
	for n := 0; n < c.Len(); n++ {
		fresh += pol.fm.compute(c.nodes[n].models, c.nodes[n].cpuFree, c.nodes[n].gpuFree, c.nodes[n].gpuCap)
	}
	if math.Abs(fresh-pol.TotalFrag()) > 1e-6*math.Max(1, fresh) {
		t.Fatalf("cached total fragmentation %v, recomputed %v", pol.TotalFrag(), fresh)
	}
}

// A batch with requests that can never fit reports them and places the rest.
func TestAllocateBatchReportsUnplaceable(t *testing.T) {
	c := testCluster(t)
	s := NewScheduler(c, NewFGPU(nil, DefaultOptions()), 1)
	reqs := []*Request{
		{Name: "ok", CPUMilli: 1000, GPUs: 1, Share: 500},
		{Name: "huge", CPUMilli: 1 << 40, GPUs: 1},
		{Name: "model", CPUMilli: 1000, GPUs: 1, Models: []string{"H100"}},
		{Name: "bad", CPUMilli: -1},
	}
	pl, errs := s.AllocateBatch(reqs, 4)
	if errs[0] != nil || len(pl[0].GPUs) != 1 {
		t.Fatalf("ok: %v %+v", errs[0], pl[0])
	}
	want := []Reason{0, ReasonTooLarge, ReasonNoModel, ReasonInvalid}
	for i := 1; i < len(reqs); i++ {
		if reason(errs[i]) != want[i] {
			t.Errorf("%s: %v, want %v", reqs[i].Name, errs[i], want[i])
		}
	}
}

// With cpuReach a sharing shape only reaches the share its CPU-limited
// copies can take: 2 free GPUs, CPU for one 500 copy -> 1500 unreachable.
func TestFragCPUReach(t *testing.T) {
	c := testCluster(t)
	w := Workload{{CPUMilli: 4000, GPUs: 1, Share: 500, Weight: 1}}
	fm := newFragModel(c, w)
	fm.cpuReach = true
	models := c.nodes[0].models
	free, capa := []int64{1000, 1000}, []int64{1000, 1000}
	if got := fm.frag(models, 4000, free, capa); got != 1500 {
		t.Fatalf("one copy: frag %v, want 1500", got)
	}
	if got := fm.frag(models, 16000, free, capa); got != 0 {
		t.Fatalf("four copies: frag %v, want 0", got)
	}
	fm.cpuReach = false
	fm.memo = map[fragKey]float64{}
	if got := fm.frag(models, 4000, free, capa); got != 0 {
		t.Fatalf("FGD: frag %v, want 0", got)
	}
}

// MixReach relaxes a CPU-heavy sharing shape's reach towards what the
// workload's mix (8 milli-CPU per share unit here) could reach with the same
// CPU: 2 free GPUs and 8 cores reach one 500 copy (1500 unreachable) but
// 1000 share for the mix.
func TestFragMixReach(t *testing.T) {
	c := testCluster(t)
	w := Workload{
		{CPUMilli: 8000, GPUs: 1, Share: 500, Weight: 0.5},
		{CPUMilli: 4000, GPUs: 1, Share: 1000, Weight: 0.5},
	}
	k, ok := mixCPUPerShare(w)
	if !ok || k != 8 {
		t.Fatalf("mix CPU per share %v, want 8", k)
	}
	models := c.nodes[0].models
	free, capa := []int64{1000, 1000}, []int64{1000, 1000}
	for _, tc := range []struct{ theta, want float64 }{{0, 750}, {0.5, 625}, {1, 500}} {
		fm := newFragModel(c, w)
		fm.cpuReach = true
		fm.mixTheta, fm.cpuPerShare = tc.theta, k
		if got := fm.frag(models, 8000, free, capa); got != tc.want {
			t.Errorf("theta %v: frag %v, want %v", tc.theta, got, tc.want)
		}
	}
	// Only when the workload is GPU-bound: the test cluster has 12.8
	// milli-CPU per share unit.
	f := NewFGPU(w, DefaultOptions())
	NewScheduler(c, f, 1)
	if f.fm.mixTheta != 0.5 {
		t.Fatalf("GPU-bound workload: mixTheta %v, want 0.5", f.fm.mixTheta)
	}
	cpuHeavy := append(Workload{{CPUMilli: 64000, Weight: 0.5}}, w...)
	f = NewFGPU(cpuHeavy, DefaultOptions())
	NewScheduler(testCluster(t), f, 1)
	if f.fm.mixTheta != 0 {
		t.Fatalf("CPU-bound workload: mixTheta %v, want 0", f.fm.mixTheta)
	}
}

// MixSplit gives sharing shapes below the split MixReachLo and the others
// MixReachHi (CPUSlack 1.25: the 500 shape reaches 1250 with theta 1, 500
// with theta 0).
func TestFragMixSplit(t *testing.T) {
	w := Workload{
		{CPUMilli: 8000, GPUs: 1, Share: 500, Weight: 0.5},
		{CPUMilli: 4000, GPUs: 1, Share: 1000, Weight: 0.5},
	}
	free, capa := []int64{1000, 1000}, []int64{1000, 1000}
	for _, tc := range []struct{ lo, hi, want float64 }{{1, 0, 375}, {0, 1, 750}, {0.5, 0.5, 562.5}} {
		c := testCluster(t)
		f := NewAblatedFGPU(w, DefaultOptions(), Ablations{MixSplit: 600, MixReachLo: tc.lo, MixReachHi: tc.hi})
		NewScheduler(c, f, 1)
		if got := f.fm.frag(c.nodes[0].models, 8000, free, capa); got != tc.want {
			t.Errorf("lo %v hi %v: frag %v, want %v", tc.lo, tc.hi, got, tc.want)
		}
	}
}

// tiePolicy scores every node alike and ranks ties by fixed groups and values.
type tiePolicy struct {
	group []int
	v     []float64
}

func (*tiePolicy) Name() string    { return "tie" }
func (*tiePolicy) Attach(*Cluster) {}
func (*tiePolicy) Score(_ *Cluster, _ int, _ *Request, _, out []int) (float64, []int) {
	return 1, out
}
func (p *tiePolicy) Tie(n int) (int, float64, bool) { return p.group[n], p.v[n], true }

// Among equal scores a TieBreaker's larger value wins only inside the group
// of the first (smallest-name) best node.
func TestTieBreakerGroups(t *testing.T) {
	c, err := NewCluster([]NodeSpec{
		{Name: "a", CPUMilli: 8000}, {Name: "b", CPUMilli: 8000}, {Name: "c", CPUMilli: 8000}, {Name: "d", CPUMilli: 8000},
	})
	if err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(c, &tiePolicy{group: []int{0, 1, 0, 0}, v: []float64{1, 9, 3, 2}}, 1)
	p, err := s.Place(&Request{CPUMilli: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeName != "c" {
		t.Fatalf("placed on %s, want c", p.NodeName)
	}
}
