package placement

import (
	"fmt"
	"math/rand"
	"reflect"
	"testing"
)

// statesFleet is k copies of four node types, names shuffled against the index order so
// that the smallest name is not the first node.
func statesFleet(k int, rng *rand.Rand) []NodeSpec {
	return fleetOf(k, rng, []NodeSpec{
		{CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		{CPUMilli: 64000, MemoryMiB: 262144, GPUs: gpus("V100", 4)},
		{CPUMilli: 32000, MemoryMiB: 65536, GPUs: gpus("T4", 2)},
		{CPUMilli: 16000, MemoryMiB: 32768},
	})
}

// mixedCapacityFleet adds GPUs of other capacities than 1000 units (smaller than some
// shares asked, which then take them whole, and larger than the free-share buckets).
func mixedCapacityFleet(k int, rng *rand.Rand) []NodeSpec {
	return fleetOf(k, rng, []NodeSpec{
		{CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		{CPUMilli: 64000, MemoryMiB: 262144, GPUs: []GPUSpec{{Model: "V100", Capacity: 400}, {Model: "V100", Capacity: 400}, {Model: "V100", Capacity: 2500}}},
		{CPUMilli: 32000, MemoryMiB: 65536, GPUs: []GPUSpec{{Model: "T4", Capacity: 120}, {Model: "T4", Capacity: 120}}},
		{CPUMilli: 16000, MemoryMiB: 32768},
	})
}

func fleetOf(k int, rng *rand.Rand, types []NodeSpec) []NodeSpec {
	var out []NodeSpec
	for _, i := range rng.Perm(len(types) * k) {
		n := types[i%len(types)]
		n.Name = fmt.Sprintf("n%04d", rng.Intn(10000)) // some names repeat: the first wins ties
		n.GPUs = append([]GPUSpec(nil), n.GPUs...)
		out = append(out, n)
	}
	return out
}

// The state index stands in for the node list only where it decides exactly as scoring
// every node does: same node, same GPUs, same reason, through allocations and releases.
func TestStateIndexDecidesAsEveryNode(t *testing.T) {
	w := Workload{{CPUMilli: 4000, GPUs: 1, Share: 300, Weight: .3, MemoryMiB: 8192}, {CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: .3},
		{CPUMilli: 2000, GPUs: 1, Share: 150, Weight: .2, MemoryMiB: 2048}, {CPUMilli: 16000, GPUs: 2, Share: 1000, Weight: .1}, {CPUMilli: 1000, Weight: .1}}
	fleets := map[string]func(int, *rand.Rand) []NodeSpec{"": statesFleet, "/mixed-capacity": mixedCapacityFleet}
	for _, name := range []string{"fgpu", "fgd", "bestfit", "spread", "pack"} {
		for fleet, specs := range fleets {
			t.Run(name+fleet, func(t *testing.T) { indexDecidesAsEveryNode(t, name, w, specs) })
		}
	}
}

func indexDecidesAsEveryNode(t *testing.T, name string, w Workload, fleet func(int, *rand.Rand) []NodeSpec) {
	rng := rand.New(rand.NewSource(7))
	c, err := NewCluster(fleet(40, rng))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(name, w)
	if err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(c, p, 1)
	if !s.byState {
		t.Fatalf("%s does not use the state index", name)
	}
	type placed struct {
		p Placement
		r *Request
	}
	var live []placed
	shares := []int64{0, 100, 150, 300, 470, 810}
	for i := range 3000 {
		if len(live) > 0 && rng.Intn(4) == 0 {
			k := rng.Intn(len(live))
			if err := c.Release(live[k].p, live[k].r); err != nil {
				t.Fatal(err)
			}
			live = append(live[:k], live[k+1:]...)
			continue
		}
		r := &Request{Name: fmt.Sprint(i), CPUMilli: int64(rng.Intn(12)) * 1000, MemoryMiB: int64(rng.Intn(40)) * 1024,
			GPUs: []int{0, 1, 1, 1, 2, 8}[rng.Intn(6)], Share: shares[rng.Intn(len(shares))]}
		if r.GPUs > 1 {
			r.Share = 0
		}
		if rng.Intn(10) == 0 {
			r.Models = []string{"V100"}
		}
		s.byState = false
		want, wantErr := s.Place(r)
		s.byState = true
		got, gotErr := s.Place(r)
		if !reflect.DeepEqual(got, want) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reason(gotErr) != reason(wantErr) {
			t.Fatalf("request %d %+v: index gives %+v, %v; every node gives %+v, %v", i, *r, got, gotErr, want, wantErr)
		}
		if wantErr == nil {
			if err := c.Assign(want, r); err != nil {
				t.Fatal(err)
			}
			live = append(live, placed{want, r})
		}
	}
	all, withGPU := c.States()
	if all >= c.Len() || withGPU > all {
		t.Errorf("%d states for %d nodes (%d with free GPU share)", all, c.Len(), withGPU)
	}
}

// A decision scores one node per distinct state, not every node: on a fleet of identical
// empty machines, one.
func TestStateIndexScoresOneNodePerState(t *testing.T) {
	specs := make([]NodeSpec, 1000)
	for i := range specs {
		specs[i] = NodeSpec{Name: fmt.Sprintf("n%04d", 999-i), CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)}
	}
	c, err := NewCluster(specs)
	if err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(c, NewFGPU(DefaultWorkload(), DefaultOptions()), 1)
	r := &Request{CPUMilli: 4000, MemoryMiB: 8192, GPUs: 1, Share: 250}
	p, err := s.Allocate(r)
	if err != nil {
		t.Fatal(err)
	}
	if p.NodeName != "n0000" || s.Scored() != 1 {
		t.Fatalf("placed on %s after scoring %d nodes; want n0000 after 1", p.NodeName, s.Scored())
	}
	if _, err := s.Allocate(r); err != nil {
		t.Fatal(err)
	}
	// Two states now (one used node, the empty ones): two scores.
	if s.Scored() != 3 {
		t.Fatalf("%d nodes scored in two decisions; want 3", s.Scored())
	}
	// An ablation that ranks nodes by identity scores every node.
	s.SetPolicy(NewAblatedFGPU(DefaultWorkload(), DefaultOptions(), Ablations{TieOrder: TieGPUsAsc}))
	before := s.Scored()
	if _, err := s.Place(r); err != nil {
		t.Fatal(err)
	}
	if n := s.Scored() - before; n != 1000 {
		t.Fatalf("ablated policy scored %d nodes; want all 1000", n)
	}
}
