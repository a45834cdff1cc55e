package placement

import (
	"fmt"
	"math/rand"
	"reflect"
	"slices"
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

// wiredFleet has machines alike but for their wiring (islands of consecutive GPUs or of
// odd and even ones, none), so that a state's GPU pick is right only for nodes wired as
// its first.
func wiredFleet(k int, rng *rand.Rand) []NodeSpec {
	interleaved := wiredGPUs("G2", 8, 0, 8)
	for g := range interleaved {
		interleaved[g].Island = fmt.Sprint(g % 2)
	}
	return fleetOf(k, rng, []NodeSpec{
		{CPUMilli: 96000, MemoryMiB: 393216, GPUs: wiredGPUs("G2", 8, 4, 4)},
		{CPUMilli: 96000, MemoryMiB: 393216, GPUs: interleaved},
		{CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		{CPUMilli: 32000, MemoryMiB: 65536, GPUs: wiredGPUs("T4", 4, 0, 2)},
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

// forEveryPolicyAndFleet runs check for each shipped policy on a fleet of one GPU capacity
// and on one of mixed capacities, with a workload of shares, whole GPUs and CPU-only pods.
func forEveryPolicyAndFleet(t *testing.T, check func(*testing.T, string, Workload, func(int, *rand.Rand) []NodeSpec)) {
	w := Workload{{CPUMilli: 4000, GPUs: 1, Share: 300, Weight: .3, MemoryMiB: 8192}, {CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: .3},
		{CPUMilli: 2000, GPUs: 1, Share: 150, Weight: .2, MemoryMiB: 2048}, {CPUMilli: 16000, GPUs: 2, Share: 1000, Weight: .1}, {CPUMilli: 1000, Weight: .1}}
	fleets := map[string]func(int, *rand.Rand) []NodeSpec{"": statesFleet, "/mixed-capacity": mixedCapacityFleet, "/wired": wiredFleet}
	for _, name := range []string{"fgpu", "fgd", "bestfit", "spread", "pack"} {
		for fleet, specs := range fleets {
			t.Run(name+fleet, func(t *testing.T) { check(t, name, w, specs) })
		}
	}
}

// The state index stands in for the node list only where it decides exactly as scoring
// every node does: same node, same GPUs, same reason, through allocations and releases.
func TestStateIndexDecidesAsEveryNode(t *testing.T) {
	forEveryPolicyAndFleet(t, indexDecidesAsEveryNode)
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

// With a filter (the allocator's), the index decides as scoring every node does too, and
// where nothing fits it asks the filter about exactly the GPUs scoring every node asks
// about (the allocator counts them to say why a claim waits).
func TestStateIndexFilteredDecidesAsEveryNode(t *testing.T) {
	forEveryPolicyAndFleet(t, filteredDecidesAsEveryNode)
}

func filteredDecidesAsEveryNode(t *testing.T, name string, w Workload, fleet func(int, *rand.Rand) []NodeSpec) {
	rng := rand.New(rand.NewSource(11))
	c, err := NewCluster(fleet(40, rng))
	if err != nil {
		t.Fatal(err)
	}
	p, err := New(name, w)
	if err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(c, p, 1)
	type placed struct {
		p Placement
		r *Request
	}
	type pair struct{ n, g int }
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
			GPUs: []int{0, 1, 1, 1, 2, 3, 8}[rng.Intn(7)], Share: shares[rng.Intn(len(shares))]}
		if r.GPUs == 8 {
			r.Share = 0
		}
		// What the filter turns down: nothing, whole nodes (pod fit), single GPUs
		// (tenancy, selectors), or all but one node (a claim whose pod is bound).
		mode, salt, only := rng.Intn(4), rng.Uint64(), rng.Intn(c.Len())
		var asked map[pair]int
		r.Filter = func(n, g int) bool {
			asked[pair{n, g}]++
			h := (uint64(n)*0x9e3779b97f4a7c15 ^ salt) * 0xbf58476d1ce4e5b9
			switch mode {
			case 1:
				return h>>60 > 4
			case 2:
				return (h^uint64(g+1)*0x94d049bb133111eb)>>60 > 3
			case 3:
				return n == only
			}
			return true
		}
		// Constraints (the allocator's, from DRA's match and distinct attributes), in
		// groups that differ from node to node, some GPUs in none.
		switch rng.Intn(6) {
		case 1:
			r.Together = func(n, g int) int { return orNone(g/(2+n%3), g == n%9) }
		case 2:
			r.Apart = func(n, g int) int { return orNone(g%(1+n%3), g == n%7) }
		case 3:
			r.Together, r.Apart = func(_, g int) int { return g / 4 }, func(_, g int) int { return g % 2 }
		}
		asked = map[pair]int{}
		s.byState = false
		want, wantErr := s.Place(r)
		wantAsked := asked
		asked = map[pair]int{}
		s.byState = true
		got, gotErr := s.Place(r)
		if !reflect.DeepEqual(got, want) || fmt.Sprint(gotErr) != fmt.Sprint(wantErr) || reason(gotErr) != reason(wantErr) {
			t.Fatalf("request %d %+v (filter %d): index gives %+v, %v; every node gives %+v, %v", i, *r, mode, got, gotErr, want, wantErr)
		}
		if gotErr == nil && !meets(r, got) {
			t.Fatalf("request %d %+v placed on node %d GPUs %v, against its constraints", i, *r, got.Node, got.GPUs)
		}
		for k, v := range asked {
			if v != 1 {
				t.Fatalf("request %d: the filter was asked %d times about node %d GPU %d", i, v, k.n, k.g)
			}
		}
		if wantErr != nil && !reflect.DeepEqual(asked, wantAsked) {
			t.Fatalf("request %d %+v fits nowhere: the filter was asked about %d GPUs; scoring every node asks about %d", i, *r, len(asked), len(wantAsked))
		}
		if wantErr == nil {
			r.Filter, r.Together, r.Apart = nil, nil, nil
			if err := c.Assign(want, r); err != nil {
				t.Fatal(err)
			}
			live = append(live, placed{want, r})
		}
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
	// A filter (the allocator's) that turns down the three nodes with the smallest names
	// (the used one among them): the index still scores one node per state, and the filter
	// is asked about the GPUs of those three nodes and of n0003 only.
	asked := 0
	rf := *r
	rf.Filter = func(n, _ int) bool {
		asked++
		return c.NodeName(n) > "n0002"
	}
	before := s.Scored()
	if p, err := s.Place(&rf); err != nil || p.NodeName != "n0003" {
		t.Fatalf("filtered request placed on %s (%v); want n0003", p.NodeName, err)
	}
	if n := s.Scored() - before; n != 2 || asked != 4*8 {
		t.Fatalf("filtered request scored %d nodes and asked about %d GPUs; want 2 and 32", n, asked)
	}
	// An ablation that ranks nodes by identity scores every node.
	s.SetPolicy(NewAblatedFGPU(DefaultWorkload(), DefaultOptions(), Ablations{TieOrder: TieGPUsAsc}))
	before = s.Scored()
	if _, err := s.Place(r); err != nil {
		t.Fatal(err)
	}
	if n := s.Scored() - before; n != 1000 {
		t.Fatalf("ablated policy scored %d nodes; want all 1000", n)
	}
}

// A filtered request scores again only the states that are new since the last request of
// its shape: every other state's outcome is kept, until the policy is replaced.
func TestFilteredRequestScoresOnlyNewStates(t *testing.T) {
	specs := make([]NodeSpec, 200)
	for i := range specs {
		specs[i] = NodeSpec{Name: fmt.Sprintf("n%04d", i), CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)}
	}
	c, err := NewCluster(specs)
	if err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(c, NewFGPU(DefaultWorkload(), DefaultOptions()), 1)
	// Nodes in many states: node i holds i%40+1 shares of a varying size.
	for i := range specs {
		for k := range i%40 + 1 {
			r := &Request{CPUMilli: 500, MemoryMiB: 1024, GPUs: 1, Share: int64(50 + 10*(k%7))}
			if err := c.Assign(Placement{NodeName: specs[i].Name, Node: i, GPUs: []int{k % 8}, Share: []int64{r.Share}}, r); err != nil {
				t.Fatal(err)
			}
		}
	}
	small := &Request{CPUMilli: 1000, MemoryMiB: 2048, GPUs: 1, Share: 50, Filter: func(int, int) bool { return true }}
	scored := func(r *Request) int64 {
		before := s.Scored()
		if _, err := s.Place(r); err != nil {
			t.Fatal(err)
		}
		return s.Scored() - before
	}
	if n := scored(small); n < 40 {
		t.Fatalf("first request scored %d states; want one per state (40 or more)", n)
	}
	if n := scored(small); n != 0 {
		t.Fatalf("the same request again scored %d states; want 0", n)
	}
	// Another shape in between keeps its own outcomes.
	other := *small
	other.Share = 300
	scored(&other)
	// A placement changes one node: at most its new state is scored.
	if _, err := s.Allocate(small); err != nil {
		t.Fatal(err)
	}
	if n := scored(small); n > 1 {
		t.Fatalf("after one placement the request scored %d states; want at most 1", n)
	}
	// A new policy scores every state again.
	s.SetPolicy(NewFGPU(DefaultWorkload(), DefaultOptions()))
	if n := scored(small); n < 40 {
		t.Fatalf("after a new policy the request scored %d states; want one per state", n)
	}
	// More shapes than are kept: the least recently asked gives way, and the decisions
	// stay those of a scheduler that kept nothing.
	fresh := func() *Scheduler { return NewScheduler(c, NewFGPU(DefaultWorkload(), DefaultOptions()), 1) }
	for i := range maxScoreShapes + 4 {
		r := *small
		r.CPUMilli = int64(1000 + 100*i)
		scored(&r)
	}
	if n := scored(small); n < 40 {
		t.Fatalf("a shape given way to %d others scored %d states; want one per state", maxScoreShapes+4, n)
	}
	for i := range maxScoreShapes + 4 {
		r := *small
		r.CPUMilli = int64(1000 + 100*i)
		got, err := s.Allocate(&r)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(got, &r); err != nil {
			t.Fatal(err)
		}
		want, err := fresh().Place(&r)
		if err != nil || got.NodeName != want.NodeName || !slices.Equal(got.GPUs, want.GPUs) {
			t.Fatalf("request %d placed on %s %v; a fresh scheduler places it on %s %v (%v)", i, got.NodeName, got.GPUs, want.NodeName, want.GPUs, err)
		}
	}
}

// orNone is group, or -1 (no group: the GPU cannot serve) where none.
func orNone(group int, none bool) int {
	if none {
		return -1
	}
	return group
}

// meets reports whether placement p keeps r's constraints.
func meets(r *Request, p Placement) bool {
	together, apart := map[int]bool{}, map[int]bool{}
	for _, g := range p.GPUs {
		if r.Together != nil {
			if r.Together(p.Node, g) < 0 {
				return false
			}
			together[r.Together(p.Node, g)] = true
		}
		if r.Apart != nil {
			if a := r.Apart(p.Node, g); a < 0 || apart[a] {
				return false
			}
			apart[r.Apart(p.Node, g)] = true
		}
	}
	return len(together) <= 1
}
