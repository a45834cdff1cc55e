package placement

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// wiredGPUs is n GPUs of model in NVLink islands of island consecutive GPUs (none
// when 0) and PCIe roots of root (none when 0), with NUMA nodes as the roots.
func wiredGPUs(model string, n, island, root int) []GPUSpec {
	out := gpus(model, n)
	for g := range out {
		if island > 0 {
			out[g].Island = fmt.Sprintf("nv%d", g/island)
		}
		if root > 0 {
			out[g].PCIeRoot = fmt.Sprintf("pci%d", g/root)
			out[g].NUMA = fmt.Sprintf("numa%d", g/root)
		}
	}
	return out
}

// wiredCluster is one node per spec, named a, b, ..., with the GPUs in taken[node]
// used whole by claims already allocated.
func wiredCluster(t *testing.T, specs [][]GPUSpec, taken map[int][]int) *Cluster {
	t.Helper()
	nodes := make([]NodeSpec, len(specs))
	for i, g := range specs {
		nodes[i] = NodeSpec{Name: string(rune('a' + i)), CPUMilli: 96000, MemoryMiB: 393216, GPUs: g}
	}
	c, err := NewCluster(nodes)
	if err != nil {
		t.Fatal(err)
	}
	for n, gs := range taken {
		for _, g := range gs {
			if err := c.Assign(Placement{Node: n, GPUs: []int{g}, Share: []int64{1000}}, &Request{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}

func newPolicy(t *testing.T, name string) Policy {
	t.Helper()
	p, err := New(name, DefaultWorkload())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// fgpu, spread and pack place inside a node by its wiring: several GPUs from the
// NVLink island (then PCIe root, then NUMA node) that fits them best, one whole GPU
// from the group with the fewest usable ones, shares off the groups still whole.
// FGD and BestFit, published baselines, stay blind to it.
func TestPlacesByWiring(t *testing.T) {
	dgx := wiredGPUs("G2", 8, 4, 4)  // two islands of 4, each under its own root
	t4 := wiredGPUs("T4", 4, 0, 2)   // no NVLink, two roots of 2
	numa := wiredGPUs("G2", 8, 0, 0) // NUMA nodes only
	for g := range numa {
		numa[g].NUMA = fmt.Sprint(g % 2) // even GPUs on one node, odd on the other
	}
	share := &Request{Name: "share", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, Share: 300}
	for _, tc := range []struct {
		name     string
		policies []string
		spec     []GPUSpec
		taken    []int
		reqs     []*Request // placed in turn; the last one's GPUs are checked
		want     []int
	}{
		{"2 GPUs go to the island already partly used", []string{"fgpu", "spread", "pack"}, dgx, []int{4},
			[]*Request{{GPUs: 2}}, []int{5, 6}},
		{"one whole GPU from the island with the fewest usable", []string{"fgpu", "spread", "pack"}, dgx, []int{4},
			[]*Request{{GPUs: 1}}, []int{5}},
		{"a share keeps off the free island", []string{"fgpu", "spread", "pack"}, dgx, []int{4},
			[]*Request{share}, []int{5}},
		{"4 GPUs find the island the shares kept whole", []string{"fgpu", "spread", "pack"}, dgx, []int{4},
			[]*Request{share, share, {GPUs: 4}}, []int{0, 1, 2, 3}},
		{"no island: the PCIe root that fits", []string{"fgpu", "spread", "pack"}, t4, []int{0},
			[]*Request{{GPUs: 2}}, []int{2, 3}},
		{"no island or root: the NUMA node", []string{"fgpu", "spread", "pack"}, numa, []int{0},
			[]*Request{{GPUs: 3}}, []int{2, 4, 6}},
		{"no group holds them: as before", []string{"fgpu"}, dgx, []int{0, 5},
			[]*Request{{GPUs: 4}}, []int{1, 2, 3, 4}},
		{"FGD and BestFit stay blind", []string{"fgd", "bestfit"}, dgx, []int{4},
			[]*Request{{GPUs: 2}}, []int{0, 1}},
	} {
		for _, name := range tc.policies {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				c := wiredCluster(t, [][]GPUSpec{tc.spec}, map[int][]int{0: tc.taken})
				s := NewScheduler(c, newPolicy(t, name), 1)
				var p Placement
				for _, r := range tc.reqs {
					var err error
					if p, err = s.Allocate(r); err != nil {
						t.Fatal(err)
					}
				}
				slices.Sort(p.GPUs)
				if !slices.Equal(p.GPUs, tc.want) {
					t.Errorf("GPUs %v, want %v", p.GPUs, tc.want)
				}
			})
		}
	}
}

// islandOf is a Together or Apart function: each node's GPUs in blocks of four.
func islandOf(_, g int) int { return g / 4 }

// Together and Apart bind every policy: a node qualifies only where its usable GPUs
// meet them, and the GPUs come from the group that fits best (Together) or from
// distinct groups (Apart). When no node with room meets them, the reason says so.
func TestTogetherApart(t *testing.T) {
	specs := [][]GPUSpec{gpus("G2", 8), gpus("G2", 8), gpus("G2", 8)}
	// Usable GPUs per block of four: a 2+2, b 1+3, c 2+1.
	taken := map[int][]int{0: {0, 1, 4, 5}, 1: {0, 1, 2, 4}, 2: {0, 1, 4, 5, 6}}
	parity := func(_, g int) int { return g % 2 }
	for _, tc := range []struct {
		name string
		r    Request
		// want is the node and its GPUs, or the error; where the node is the
		// policy's choice, wantOn has the GPUs each node gives.
		want   string
		wantOn map[string][]int
	}{
		{"together: only b has 3 in one block", Request{GPUs: 3, Together: islandOf}, "b [5 6 7]", nil},
		{"together: the block that fits 2 best", Request{GPUs: 2, Together: islandOf}, "",
			map[string][]int{"a": {2, 3}, "b": {5, 6}, "c": {2, 3}}},
		{"together: no block holds 4", Request{GPUs: 4, Together: islandOf},
			"no node meets the GPU constraint: no node has 4 usable GPUs in one group of the match constraint", nil},
		{"no node has room for 5: capacity, not the constraint", Request{GPUs: 5, Together: islandOf},
			"no node has enough free capacity", nil},
		{"apart: one GPU from each block", Request{GPUs: 2, Apart: islandOf}, "",
			map[string][]int{"a": {2, 6}, "b": {3, 5}, "c": {2, 7}}},
		{"apart: 3 blocks asked, 2 on each node", Request{GPUs: 3, Apart: islandOf},
			"no node meets the GPU constraint: no node has 3 usable GPUs in different groups of the distinct constraint", nil},
		{"together and apart: one block, odd and even", Request{GPUs: 2, Together: islandOf, Apart: parity}, "",
			map[string][]int{"a": {2, 3}, "b": {5, 6}, "c": {2, 3}}},
		{"group -1: GPUs that cannot serve", Request{GPUs: 1, Apart: func(n, g int) int {
			if n == 2 && g == 7 {
				return 0
			}
			return -1
		}}, "c [7]", nil},
	} {
		for _, name := range Names() {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				c := wiredCluster(t, specs, taken)
				r := tc.r
				r.Name = "r"
				p, err := NewScheduler(c, newPolicy(t, name), 1).Place(&r)
				got := ""
				if err != nil {
					got = strings.TrimPrefix(err.Error(), `cannot place "r": `)
				} else {
					slices.Sort(p.GPUs)
					got = fmt.Sprint(p.NodeName, " ", p.GPUs)
				}
				switch {
				case tc.wantOn == nil && got != tc.want:
					t.Errorf("got %q, want %q", got, tc.want)
				case tc.wantOn != nil && (err != nil || !slices.Equal(p.GPUs, tc.wantOn[p.NodeName])):
					t.Errorf("got %q (%v), want on that node %v", got, err, tc.wantOn[p.NodeName])
				}
			})
		}
	}
}

// Nodes in the same state but wired differently are different states: a GPU pick made
// for one is never reused for the other. Machines wired alike share states whatever
// their groups are called.
func TestStatesTellWiringApart(t *testing.T) {
	other := wiredGPUs("G2", 8, 0, 4) // no NVLink: the first GPUs are the island below
	for g := range other {
		if g < 2 {
			other[g].Island = "pair"
		}
	}
	renamed := wiredGPUs("G2", 8, 4, 4)
	for g := range renamed {
		renamed[g].Island = strings.ToUpper(renamed[g].Island)
	}
	c := wiredCluster(t, [][]GPUSpec{wiredGPUs("G2", 8, 4, 4), other, renamed}, map[int][]int{0: {4}, 1: {4}, 2: {4}})
	if all, _ := c.States(); all != 2 {
		t.Errorf("%d states; want 2 (a and c wired alike, b not)", all)
	}
	// The filter turns a down, so b, the first node of no other state, scores its own GPUs.
	r := &Request{GPUs: 2, Filter: func(n, _ int) bool { return n == 1 }}
	p, err := NewScheduler(c, newPolicy(t, "fgpu"), 1).Place(r)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(p.GPUs)
	if p.NodeName != "b" || !slices.Equal(p.GPUs, []int{0, 1}) {
		t.Errorf("placed on %s %v; want b [0 1], its NVLink pair", p.NodeName, p.GPUs)
	}
}
