package placement

import (
	"math"
	"testing"
)

// A 320m pod beside a 470m one leaves 210m that no sharing shape fills; the
// LP prices (470m: 1/2, 320m: 1/3, 650m: 2/3) say it belongs on a fresh GPU,
// where a 650m or two more 320m pods complete it. FGD's one-step measure
// prefers the partly used GPU: a fresh GPU with 680m left is fragment for
// the frequent whole-GPU shape.
func TestPackPriceKeepsGapsForTheirComplement(t *testing.T) {
	w := Workload{
		{CPUMilli: 1000, GPUs: 1, Share: 470, Weight: 0.3},
		{CPUMilli: 1000, GPUs: 1, Share: 320, Weight: 0.3},
		{CPUMilli: 1000, GPUs: 1, Share: 650, Weight: 0.1},
		{CPUMilli: 1000, GPUs: 1, Weight: 0.3},
	}
	for _, tc := range []struct {
		packPrice float64
		wantGPU   int
	}{{0, 0}, {1e6, 1}} {
		c, err := NewCluster([]NodeSpec{{Name: "n", CPUMilli: 64000, MemoryMiB: 1 << 20, GPUs: gpus("V100", 2)}})
		if err != nil {
			t.Fatal(err)
		}
		o := DefaultOptions()
		o.PackPrice = tc.packPrice
		pol := NewFGPU(w, o)
		s := NewScheduler(c, pol, 1)
		if err := c.Assign(Placement{Node: 0, GPUs: []int{0}, Share: []int64{470}}, &Request{}); err != nil {
			t.Fatal(err)
		}
		p, err := s.Place(&Request{CPUMilli: 1000, GPUs: 1, Share: 320})
		if err != nil || p.GPUs[0] != tc.wantGPU {
			t.Errorf("PackPrice %g: placed on %+v (%v), want GPU %d", tc.packPrice, p, err, tc.wantGPU)
		}
	}
}

// The loss is zero for a perfect complement and for a fresh GPU, and a
// sixth of a GPU for 320m beside 470m.
func TestPackLoss(t *testing.T) {
	l := newLPLoss(Workload{
		{GPUs: 1, Share: 470, Weight: 0.4},
		{GPUs: 1, Share: 320, Weight: 0.4},
		{GPUs: 1, Share: 650, Weight: 0.2},
	}, false)
	for _, tc := range []struct {
		free, share int64
		want        float64
	}{{1000, 320, 0}, {350, 320, 0}, {530, 470, 0}, {530, 320, 0.167}, {1000, 470, 0}} {
		if got := l.loss(tc.free, tc.share, 1000, 0, 0); got != tc.want {
			t.Errorf("loss of %dm in a %dm gap = %v, want %v", tc.share, tc.free, got, tc.want)
		}
	}
}

// Counting CPU (unless NoPackCPU), a gap is worth only what the CPU left
// beside it can host.
func TestPackLossCountsCPU(t *testing.T) {
	l := newLPLoss(Workload{
		{CPUMilli: 1000, GPUs: 1, Share: 470, Weight: 0.4},
		{CPUMilli: 4000, GPUs: 1, Share: 320, Weight: 0.4},
		{CPUMilli: 1000, GPUs: 1, Share: 650, Weight: 0.2},
	}, true)
	for _, tc := range []struct {
		cpuAfter int64
		want     float64
	}{{1000, 0}, {500, 0.667}} {
		// 680m left: a 650m pod (1 core) completes it, if the core is free.
		if got := l.loss(1000, 320, 1000, 5000, tc.cpuAfter); got != tc.want {
			t.Errorf("320m on a fresh GPU leaving %dm CPU: loss %v, want %v", tc.cpuAfter, got, tc.want)
		}
	}
}

// halves is a workload of 500m pods needing 8 cores and whole-GPU pods
// needing 2.
var halves = Workload{
	{CPUMilli: 8000, GPUs: 1, Share: 500, Weight: 0.5},
	{CPUMilli: 2000, GPUs: 1, Share: 1000, Weight: 0.5},
}

// A node's gaps share its free CPU: two 500m gaps with 8 cores between them
// hold one 500m pod, not two, though each alone has the CPU for one.
func TestNodeValueSharesCPU(t *testing.T) {
	l := newLPLoss(halves, true)
	l.withNodeValues(halves, 64000, 0)
	capa := []int64{1000, 1000, 1000}
	for _, tc := range []struct {
		free []int64
		cpu  int64
		want float64
	}{
		{[]int64{500, 500, 0}, 8000, 0.5},
		{[]int64{500, 500, 0}, 16000, 1},
		{[]int64{500, 500, 1000}, 18000, 2},
		{[]int64{500, 500, 1000}, 14000, 0.5}, // 6 cores left for the second gap: nothing
		{[]int64{0, 0, 1000}, 2000, 1},        // a whole-GPU pod
		{[]int64{0, 0, 1000}, 1000, 0},        // no pod fits its CPU
	} {
		if got := l.nodeValue(tc.free, capa, tc.cpu, 0); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("free %v with %dm CPU: value %v, want %v", tc.free, tc.cpu, got, tc.want)
		}
	}
}

// A whole-GPU pod whose CPU would strand a gap on one node goes to another
// where it strands nothing. FGD's score ties the two nodes (its CPU reach,
// with slack, still sees both gaps reachable), so without the node loss
// (NoPackNode) the first node by name takes it.
func TestPackNodeKeepsCPUBesideGaps(t *testing.T) {
	for _, tc := range []struct {
		packNode bool
		want     string
	}{{false, "a"}, {true, "b"}} {
		c, err := NewCluster([]NodeSpec{
			{Name: "a", CPUMilli: 18000, MemoryMiB: 1 << 20, GPUs: gpus("V100", 3)},
			{Name: "b", CPUMilli: 10000, MemoryMiB: 1 << 20, GPUs: gpus("V100", 2)},
		})
		if err != nil {
			t.Fatal(err)
		}
		pol := NewAblatedFGPU(halves, DefaultOptions(), Ablations{NoPackNode: !tc.packNode})
		s := NewScheduler(c, pol, 1)
		for _, p := range []Placement{
			{Node: 0, GPUs: []int{0}, Share: []int64{500}},
			{Node: 0, GPUs: []int{1}, Share: []int64{500}},
			{Node: 1, GPUs: []int{0}, Share: []int64{1000}},
		} {
			if err := c.Assign(p, &Request{}); err != nil {
				t.Fatal(err)
			}
		}
		p, err := s.Place(&Request{CPUMilli: 4000, GPUs: 1, Share: 1000})
		if err != nil || p.NodeName != tc.want {
			t.Errorf("PackNode %v: placed on %+v (%v), want node %s", tc.packNode, p, err, tc.want)
		}
	}
}

// A gap is valued with its pods' mean CPU, not the thriftiest pod's: with
// 500m pods asking for 4 or 12 cores alike, two 500m gaps beside 8 cores
// hold one pod's worth, not two.
func TestNodeValueUsesMeanCPU(t *testing.T) {
	w := Workload{
		{CPUMilli: 4000, GPUs: 1, Share: 500, Weight: 0.5},
		{CPUMilli: 12000, GPUs: 1, Share: 500, Weight: 0.5},
	}
	l := newLPLoss(w, true)
	l.withNodeValues(w, 64000, 0)
	if got := l.nodeValue([]int64{500, 500}, []int64{1000, 1000}, 8000, 0); math.Abs(got-0.5) > 1e-9 {
		t.Errorf("two 500m gaps beside 8 cores: value %v, want 0.5", got)
	}
}

// Memory strands a gap as CPU does: two 500m gaps beside 16 cores but
// memory for one 20 GiB pod hold one pod's worth.
func TestNodeValueCountsMemory(t *testing.T) {
	w := Workload{{CPUMilli: 4000, MemoryMiB: 20480, GPUs: 1, Share: 500, Weight: 1}}
	l := newLPLoss(w, true)
	l.withNodeValues(w, 64000, 256<<10)
	capa := []int64{1000, 1000}
	for _, tc := range []struct {
		mem  int64
		want float64
	}{{40960, 1}, {30000, 0.5}, {10000, 0}} {
		if got := l.nodeValue([]int64{500, 500}, capa, 16000, tc.mem); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("two 500m gaps beside %d MiB: value %v, want %v", tc.mem, got, tc.want)
		}
	}
}

// The same through the policy, for memory: a whole-GPU pod whose 20 GiB
// would leave a 500m gap's pods without memory on one node goes to the
// other. FGD ignores memory and ties the nodes, so without the node loss
// (NoPackNode) the first by name takes it.
func TestPackNodeKeepsMemoryBesideGaps(t *testing.T) {
	w := Workload{
		{CPUMilli: 1000, MemoryMiB: 20 << 10, GPUs: 1, Share: 500, Weight: 0.5},
		{CPUMilli: 1000, MemoryMiB: 2 << 10, GPUs: 1, Share: 1000, Weight: 0.5},
	}
	for _, tc := range []struct {
		packNode bool
		want     string
	}{{false, "a"}, {true, "b"}} {
		c, err := NewCluster([]NodeSpec{
			{Name: "a", CPUMilli: 64000, MemoryMiB: 50 << 10, GPUs: gpus("V100", 3)},
			{Name: "b", CPUMilli: 64000, MemoryMiB: 30 << 10, GPUs: gpus("V100", 2)},
		})
		if err != nil {
			t.Fatal(err)
		}
		pol := NewAblatedFGPU(w, DefaultOptions(), Ablations{NoPackNode: !tc.packNode})
		s := NewScheduler(c, pol, 1)
		for _, p := range []Placement{
			{Node: 0, GPUs: []int{0}, Share: []int64{500}},
			{Node: 0, GPUs: []int{1}, Share: []int64{500}},
			{Node: 1, GPUs: []int{0}, Share: []int64{1000}},
		} {
			if err := c.Assign(p, &Request{}); err != nil {
				t.Fatal(err)
			}
		}
		p, err := s.Place(&Request{CPUMilli: 1000, MemoryMiB: 20 << 10, GPUs: 1, Share: 1000})
		if err != nil || p.NodeName != tc.want {
			t.Errorf("PackNode %v: placed on %+v (%v), want node %s", tc.packNode, p, err, tc.want)
		}
	}
}
