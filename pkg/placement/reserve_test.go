package placement

import "testing"

// reserveCluster: two 8-GPU nodes ("a" fresh, "b" with one GPU partly used)
// and a 2-GPU node.
func reserveCluster(t *testing.T) *Cluster {
	t.Helper()
	c, err := NewCluster([]NodeSpec{
		{Name: "a", CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		{Name: "b", CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		{Name: "c", CPUMilli: 64000, MemoryMiB: 262144, GPUs: gpus("G2", 2)},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var reserveWorkload = Workload{
	{CPUMilli: 4000, GPUs: 1, Share: 500, Weight: 0.6},
	{CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: 0.3},
	{CPUMilli: 88000, GPUs: 8, Share: 1000, Weight: 0.05},
	{CPUMilli: 16000, GPUs: 2, Share: 1000, Weight: 0.05},
}

func TestReserveCountsHostsIncrementally(t *testing.T) {
	c := reserveCluster(t)
	r := newReserve(c, reserveWorkload, 1)
	if len(r.shapes) != 2 {
		t.Fatalf("tracked %d multi-GPU shapes, want 2", len(r.shapes))
	}
	count := func(gpus int) int {
		for i, s := range r.shapes {
			if s.gpus == gpus {
				return r.count[i]
			}
		}
		t.Fatalf("no %d-GPU shape", gpus)
		return 0
	}
	if count(8) != 2 || count(2) != 3 {
		t.Fatalf("fresh: 8-GPU hosts %d, 2-GPU hosts %d; want 2, 3", count(8), count(2))
	}
	frac := &Request{CPUMilli: 4000, GPUs: 1, Share: 500}
	p := Placement{Node: 1, GPUs: []int{0}, Share: []int64{500}}
	if err := c.Assign(p, frac); err != nil {
		t.Fatal(err)
	}
	if count(8) != 1 || count(2) != 3 {
		t.Fatalf("after a share on b: 8-GPU hosts %d, 2-GPU hosts %d; want 1, 3", count(8), count(2))
	}
	// CPU counts too: taking b's CPU below 16 cores stops it hosting 2 GPUs.
	cpu := &Request{CPUMilli: 80000}
	if err := c.Assign(Placement{Node: 1}, cpu); err != nil {
		t.Fatal(err)
	}
	if count(2) != 2 {
		t.Fatalf("after CPU on b: 2-GPU hosts %d, want 2", count(2))
	}
	if err := c.Release(Placement{Node: 1}, cpu); err != nil {
		t.Fatal(err)
	}
	if err := c.Release(p, frac); err != nil {
		t.Fatal(err)
	}
	if count(8) != 2 || count(2) != 3 {
		t.Fatalf("after release: 8-GPU hosts %d, 2-GPU hosts %d; want 2, 3", count(8), count(2))
	}
}

func TestReserveKeepsLastHostWhole(t *testing.T) {
	// "a" is the only node that can still host the (rare) 8-GPU shape. Its
	// CPU, not its GPUs, limits the 500m shape, so a one-GPU pod with little
	// CPU lowers a's fragmentation and plain fgpu sends it there.
	w := Workload{
		{CPUMilli: 4000, GPUs: 1, Share: 500, Weight: 0.6},
		{CPUMilli: 8000, GPUs: 1, Share: 1000, Weight: 0.399},
		{CPUMilli: 16000, GPUs: 8, Share: 1000, Weight: 0.001},
	}
	place := func(f *FGPU) string {
		c, err := NewCluster([]NodeSpec{
			{Name: "a", CPUMilli: 40000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
			{Name: "b", CPUMilli: 96000, MemoryMiB: 393216, GPUs: gpus("G2", 8)},
		})
		if err != nil {
			t.Fatal(err)
		}
		s := NewScheduler(c, f, 1)
		used := &Request{CPUMilli: 4000, GPUs: 1, Share: 500}
		if err := c.Assign(Placement{Node: 1, GPUs: []int{0}, Share: []int64{500}}, used); err != nil {
			t.Fatal(err)
		}
		p, err := s.Place(&Request{Name: "one", CPUMilli: 2000, GPUs: 1})
		if err != nil {
			t.Fatal(err)
		}
		return p.NodeName
	}
	if got := place(NewFGPU(w, DefaultOptions())); got != "a" {
		t.Fatalf("plain fgpu placed on %s, want a", got)
	}
	for name, a := range map[string]Ablations{
		"threshold": {Reserve: 100, ReserveAbove: true},
		"ratio":     {ReserveRatio: 1000},
	} {
		if got := place(NewAblatedFGPU(w, DefaultOptions(), a)); got != "b" {
			t.Errorf("%s reserve placed on %s, want b (a is the last 8-GPU host)", name, got)
		}
	}
}
