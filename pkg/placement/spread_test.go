package placement

import (
	"slices"
	"testing"
)

// occupied builds a cluster of 1000-unit GPUs with the given shares already
// taken, per node and GPU.
func occupied(t *testing.T, used map[string][]int64) *Cluster {
	t.Helper()
	names := make([]string, 0, len(used))
	for n := range used {
		names = append(names, n)
	}
	slices.Sort(names)
	specs := make([]NodeSpec, len(names))
	for i, n := range names {
		specs[i] = NodeSpec{Name: n, CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: gpus("V100", len(used[n]))}
	}
	c, err := NewCluster(specs)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range names {
		for g, share := range used[n] {
			if share == 0 {
				continue
			}
			if err := c.Assign(Placement{Node: i, GPUs: []int{g}, Share: []int64{share}}, &Request{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return c
}

func place(t *testing.T, c *Cluster, p Policy, r *Request) Placement {
	t.Helper()
	pl, err := NewScheduler(c, p, 1).Place(r)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(pl.GPUs)
	return pl
}

// Inside a node, spread takes the GPU with the most free share and pack the
// one with the least that still fits the request.
func TestSpreadPackPickGPU(t *testing.T) {
	used := map[string][]int64{"a": {0, 700, 400, 900}}
	r := &Request{CPUMilli: 1000, GPUs: 1, Share: 200}
	for _, tc := range []struct {
		p    Policy
		want int
	}{{Spread{}, 0}, {Pack{}, 1}} {
		if got := place(t, occupied(t, used), tc.p, r); got.GPUs[0] != tc.want {
			t.Errorf("%s: placed on GPU %v, want %d", tc.p.Name(), got.GPUs, tc.want)
		}
	}
}

// A multi-GPU request takes the two least loaded GPUs with spread and the
// two fullest that fit with pack.
func TestSpreadPackPickGPUs(t *testing.T) {
	used := map[string][]int64{"a": {300, 0, 700, 600, 800}}
	r := &Request{CPUMilli: 1000, GPUs: 2, Share: 250}
	for _, tc := range []struct {
		p    Policy
		want []int
	}{{Spread{}, []int{0, 1}}, {Pack{}, []int{2, 3}}} {
		if got := place(t, occupied(t, used), tc.p, r); !slices.Equal(got.GPUs, tc.want) {
			t.Errorf("%s: placed on GPUs %v, want %v", tc.p.Name(), got.GPUs, tc.want)
		}
	}
}

// Among nodes, each policy looks at the GPU it would choose, not at the
// node's total: b holds both the freest GPU and the fullest, so spread and
// pack both take it, though c has more free share and a as much.
func TestSpreadPackPickNode(t *testing.T) {
	r := &Request{CPUMilli: 1000, GPUs: 1, Share: 100}
	for _, tc := range []struct {
		used         map[string][]int64
		spread, pack string
	}{
		{map[string][]int64{"a": {500, 500}, "b": {100, 900}, "c": {300, 300}}, "b", "b"},
		{map[string][]int64{"a": {500, 500}, "c": {300, 300}, "d": {400, 400}}, "c", "a"},
		// equal scores: the smallest name
		{map[string][]int64{"b": {400}, "a": {400}}, "a", "a"},
	} {
		if got := place(t, occupied(t, tc.used), Spread{}, r); got.NodeName != tc.spread {
			t.Errorf("spread on %v: placed on %s, want %s", tc.used, got.NodeName, tc.spread)
		}
		if got := place(t, occupied(t, tc.used), Pack{}, r); got.NodeName != tc.pack {
			t.Errorf("pack on %v: placed on %s, want %s", tc.used, got.NodeName, tc.pack)
		}
	}
}

// The node score is the fraction of the chosen GPUs' capacity left free
// after the placement, negated for pack; a whole GPU leaves nothing.
func TestSpreadPackScore(t *testing.T) {
	c := occupied(t, map[string][]int64{"a": {0, 250, 0}})
	for _, tc := range []struct {
		r                    *Request
		elig                 []int
		spread, pack         float64
		spreadGPUs, packGPUs []int
	}{
		{&Request{GPUs: 2, Share: 250}, []int{0, 1, 2}, 0.75, -0.625, []int{0, 2}, []int{1, 0}},
		{&Request{GPUs: 1}, []int{0, 2}, 0, 0, []int{0}, []int{0}},
	} {
		if s, g := (Spread{}).Score(c, 0, tc.r, tc.elig, nil); s != tc.spread || !slices.Equal(g, tc.spreadGPUs) {
			t.Errorf("spread %+v: score %v on %v, want %v on %v", *tc.r, s, g, tc.spread, tc.spreadGPUs)
		}
		if s, g := (Pack{}).Score(c, 0, tc.r, tc.elig, nil); s != tc.pack || !slices.Equal(g, tc.packGPUs) {
			t.Errorf("pack %+v: score %v on %v, want %v on %v", *tc.r, s, g, tc.pack, tc.packGPUs)
		}
	}
}
