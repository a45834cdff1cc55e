package placement

import (
	"errors"
	"math"
	"math/rand"
	"testing"
)

func gpus(model string, n int) []GPUSpec {
	out := make([]GPUSpec, n)
	for i := range out {
		out[i] = GPUSpec{Model: model}
	}
	return out
}

func testCluster(t *testing.T) *Cluster {
	t.Helper()
	c, err := NewCluster([]NodeSpec{
		{Name: "a", CPUMilli: 32000, MemoryMiB: 65536, GPUs: gpus("T4", 2)},
		{Name: "b", CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func reason(err error) Reason {
	var ue *UnplaceableError
	if errors.As(err, &ue) {
		return ue.Reason
	}
	return 0
}

func TestAssignReleaseRoundTrip(t *testing.T) {
	c := testCluster(t)
	r := &Request{Name: "x", CPUMilli: 4000, MemoryMiB: 1024, GPUs: 1, Share: 300}
	p := Placement{Node: 1, GPUs: []int{3}, Share: []int64{300}}
	if err := c.Assign(p, r); err != nil {
		t.Fatal(err)
	}
	free, _ := c.GPUs(1)
	if free[3] != 700 || c.GPUFree() != 10000-300 {
		t.Fatalf("after assign: gpu3 free %d, cluster free %d", free[3], c.GPUFree())
	}
	if cpu, _ := c.FreeCPU(1); cpu != 92000 {
		t.Fatalf("cpu free %d", cpu)
	}
	if err := c.Release(p, r); err != nil {
		t.Fatal(err)
	}
	if free[3] != 1000 || c.GPUFree() != 10000 {
		t.Fatalf("after release: gpu3 free %d", free[3])
	}
	// Releasing again would exceed capacity: refused, nothing changes.
	if err := c.Release(p, r); err == nil {
		t.Fatal("double release accepted")
	}
	// Over-assigning a GPU is refused and changes nothing.
	big := Placement{Node: 0, GPUs: []int{0, 1}, Share: []int64{1000, 1001}}
	if err := c.Assign(big, &Request{GPUs: 2}); err == nil {
		t.Fatal("over-assignment accepted")
	}
	if c.GPUFree() != 10000 {
		t.Fatal("failed assign changed state")
	}
	if err := c.Assign(Placement{Node: 5}, r); err == nil {
		t.Fatal("bad node accepted")
	}
}

func TestPlaceReasons(t *testing.T) {
	c := testCluster(t)
	s := NewScheduler(c, NewFGPU(nil, DefaultOptions()), 1)
	cases := []struct {
		name string
		r    Request
		want Reason
	}{
		{"negative", Request{CPUMilli: -1}, ReasonInvalid},
		{"unknown model", Request{GPUs: 1, Models: []string{"B200"}}, ReasonNoModel},
		{"too many GPUs", Request{GPUs: 9}, ReasonTooLarge},
		{"too much CPU", Request{CPUMilli: 200000, GPUs: 1}, ReasonTooLarge},
		{"model with too few GPUs", Request{GPUs: 4, Models: []string{"T4"}}, ReasonTooLarge},
	}
	for _, tc := range cases {
		if _, err := s.Place(&tc.r); reason(err) != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	// Fill the cluster with whole GPUs; then a whole GPU has no capacity.
	for i := 0; i < 10; i++ {
		if _, err := s.Allocate(&Request{GPUs: 1}); err != nil {
			t.Fatalf("fill %d: %v", i, err)
		}
	}
	if _, err := s.Place(&Request{GPUs: 1}); reason(err) != ReasonNoCapacity {
		t.Fatalf("full cluster: got %v", err)
	}
}

func TestPlaceRespectsModelsShareAndFilter(t *testing.T) {
	c := testCluster(t)
	s := NewScheduler(c, NewFGPU(nil, DefaultOptions()), 1)
	p, err := s.Allocate(&Request{GPUs: 1, Share: 600, Models: []string{"T4"}})
	if err != nil || p.Node != 0 {
		t.Fatalf("T4 request on node %d: %v", p.Node, err)
	}
	// A 500 share no longer fits next to 600 on that GPU; whole GPUs need a
	// fully free GPU.
	free, _ := c.GPUs(0)
	p2, err := s.Allocate(&Request{GPUs: 1, Share: 500, Models: []string{"T4"}})
	if err != nil || p2.Node != 0 || free[p2.GPUs[0]] != 500 || p2.GPUs[0] == p.GPUs[0] {
		t.Fatalf("second T4 share: %+v %v", p2, err)
	}
	if _, err := s.Place(&Request{GPUs: 1, Models: []string{"T4"}}); reason(err) != ReasonNoCapacity {
		t.Fatalf("whole T4 should not fit: %v", err)
	}
	// Filter: only GPU 5 of node b is allowed.
	only5 := func(n, g int) bool { return n == 1 && g == 5 }
	p3, err := s.Place(&Request{GPUs: 1, Share: 100, Filter: only5})
	if err != nil || p3.Node != 1 || p3.GPUs[0] != 5 {
		t.Fatalf("filter ignored: %+v %v", p3, err)
	}
	if _, err := s.Place(&Request{GPUs: 2, Filter: only5}); err == nil {
		t.Fatal("filter allowed two GPUs")
	}
}

// The fragmentation of a hand-worked node: free GPUs [1000, 400], one shape
// wanting 500 of a GPU (half the weight) and a CPU-only shape (the other
// half). The CPU-only shape counts all 1400 free as fragment, the GPU shape
// only the 400 it cannot use: 0.5*1400 + 0.5*400 = 900.
func TestFragHandWorked(t *testing.T) {
	c := testCluster(t)
	w := Workload{{CPUMilli: 1000, GPUs: 1, Share: 500, Weight: 0.5}, {CPUMilli: 1000, Weight: 0.5}}
	fm := newFragModel(c, w)
	models := c.nodes[0].models
	got := fm.frag(models, 10000, []int64{1000, 400}, []int64{1000, 1000})
	if got != 900 {
		t.Fatalf("frag = %v, want 900", got)
	}
	// Without CPU for the GPU shape, all free share is fragment.
	if got := fm.frag(models, 500, []int64{1000, 400}, []int64{1000, 1000}); got != 1400 {
		t.Fatalf("frag without CPU = %v, want 1400", got)
	}
	// The memo returns the same for a permutation of the same state.
	if got := fm.frag(models, 10000, []int64{400, 1000}, []int64{1000, 1000}); got != 900 {
		t.Fatalf("memoised permutation = %v", got)
	}
}

// FGD puts a 500 share on the free GPU rather than leave 100 on the 600 one:
// [500,600] leaves nothing the workload's 500 shape cannot use.
func TestFGDAvoidsFragment(t *testing.T) {
	w := Workload{{CPUMilli: 1000, GPUs: 1, Share: 500, Weight: 1}}
	for _, pol := range []Policy{NewFGD(w), NewFGPU(w, DefaultOptions())} {
		c, _ := NewCluster([]NodeSpec{{Name: "n", CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: gpus("V100", 2)}})
		s := NewScheduler(c, pol, 1)
		if err := c.Assign(Placement{Node: 0, GPUs: []int{1}, Share: []int64{400}}, &Request{}); err != nil {
			t.Fatal(err)
		}
		p, err := s.Place(&Request{CPUMilli: 1000, GPUs: 1, Share: 500})
		if err != nil || p.GPUs[0] != 0 {
			t.Fatalf("%s chose %+v (%v), want GPU 0", pol.Name(), p, err)
		}
	}
}

// The per-node cache kept by OnChange must equal a fresh computation after
// any sequence of allocations and releases.
func TestIncrementalFragMatchesRecompute(t *testing.T) {
	specs := make([]NodeSpec, 20)
	for i := range specs {
		specs[i] = NodeSpec{Name: "n", CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: gpus("A", 1+i%8)}
	}
	c, _ := NewCluster(specs)
	w := Workload{{CPUMilli: 4000, GPUs: 1, Share: 300, Weight: .4}, {CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: .4},
		{CPUMilli: 16000, GPUs: 2, Share: 1000, Weight: .1}, {CPUMilli: 2000, Weight: .1}}
	f := NewFGD(w)
	s := NewScheduler(c, f, 7)
	rng := rand.New(rand.NewSource(7))
	type live struct {
		p Placement
		r *Request
	}
	var alive []live
	for i := 0; i < 2000; i++ {
		if len(alive) > 0 && rng.Intn(3) == 0 {
			k := rng.Intn(len(alive))
			if err := c.Release(alive[k].p, alive[k].r); err != nil {
				t.Fatal(err)
			}
			alive = append(alive[:k], alive[k+1:]...)
		} else {
			sh := w[rng.Intn(len(w))]
			r := &Request{CPUMilli: sh.CPUMilli, GPUs: sh.GPUs, Share: sh.Share}
			if r.Share == 1000 {
				r.Share = 0
			}
			if p, err := s.Allocate(r); err == nil {
				alive = append(alive, live{p, r})
			}
		}
		for n := 0; n < c.Len(); n++ {
			nd := &c.nodes[n]
			if want := f.fm.compute(nd.models, nd.cpuFree, nd.gpuFree, nd.gpuCap); math.Abs(f.cur[n]-want) > 1e-9 {
				t.Fatalf("step %d node %d: cached %v, recomputed %v", i, n, f.cur[n], want)
			}
		}
	}
}

func TestTypicalShapes(t *testing.T) {
	var reqs []Request
	for i := 0; i < 90; i++ {
		reqs = append(reqs, Request{CPUMilli: 1000, MemoryMiB: int64(1000 + 20*(i%2)), GPUs: 1, Share: 500})
	}
	for i := 0; i < 10; i++ {
		reqs = append(reqs, Request{CPUMilli: 8000, GPUs: 8})
	}
	w := TypicalShapes(reqs, 1)
	if len(w) != 2 || w[0].Share != 500 || math.Abs(w[0].Weight-0.9) > 1e-12 || w[1].Share != 1000 {
		t.Fatalf("shapes %+v", w)
	}
	if w[0].MemoryMiB != 1010 { // memory is averaged, not part of the shape
		t.Errorf("mean memory %d, want 1010", w[0].MemoryMiB)
	}
	if w := TypicalShapes(reqs, 0.5); len(w) != 2 {
		// steps of ten shapes: both are kept even for a 50% cut
		t.Fatalf("cut kept %d shapes", len(w))
	}
}

func TestNewUnknownPolicy(t *testing.T) {
	if _, err := New("nope", nil); err == nil {
		t.Fatal("unknown policy accepted")
	}
	for _, n := range Names() {
		if p, err := New(n, nil); err != nil || p.Name() != n {
			t.Fatalf("policy %s: %v", n, err)
		}
	}
}
