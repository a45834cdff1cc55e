package sim

import (
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// With Learn, the policy starts from the default workload and is handed the learned one
// as pods arrive, as the allocator's is as claims are decided.
func TestRunLearnsWorkload(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV))
	if err != nil {
		t.Fatal(err)
	}
	pods := []placement.Request{{Name: "a", CPUMilli: 1000, MemoryMiB: 1024, GPUs: 1, Share: 300}}
	var got []placement.Workload
	lo := placement.LearnOptions{HalfLife: 100, MinSeen: 5, Every: 5}
	cfg := Config{Nodes: nodes, Pods: pods, Seed: 1, Tune: 1, Learn: &lo, NewPolicy: func(w placement.Workload) placement.Policy {
		got = append(got, w)
		return placement.NewFGPU(w, placement.DefaultOptions())
	}}
	res, err := Run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// 10 GPUs at 0.3 each: 33 pods arrive; policies at the start, after 5, 10, ... 30.
	if res.Placed != 30 || len(got) != 7 || res.Rebuilds != 6 {
		t.Fatalf("placed %d, %d policies built, %d rebuilds counted", res.Placed, len(got), res.Rebuilds)
	}
	if len(got[0]) != len(placement.DefaultWorkload()) {
		t.Errorf("first policy's workload %+v, want the default", got[0])
	}
	if w := got[len(got)-1]; len(w) != 1 || w[0].Share != 300 || w[0].CPUMilli != 1000 {
		t.Errorf("last policy's workload %+v", w)
	}
	cfg.Batch = 4
	if _, err := Run(cfg); err == nil {
		t.Error("a learned workload was accepted with batches")
	}
}

func TestReplicate(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV))
	if err != nil {
		t.Fatal(err)
	}
	fleet := Replicate(nodes, 3)
	if len(fleet) != 6 || fleet[0].Name != "r00-n0" || fleet[5].Name != "r02-n1" || len(fleet[5].GPUs) != 8 {
		t.Fatalf("fleet %+v", fleet)
	}
	for i := 1; i < len(fleet); i++ {
		if fleet[i-1].Name >= fleet[i].Name {
			t.Fatalf("not in name order: %s, %s", fleet[i-1].Name, fleet[i].Name)
		}
	}
	fleet[0].GPUs[0].Model = "X"
	if nodes[0].GPUs[0].Model != "T4" || fleet[2].GPUs[0].Model != "T4" {
		t.Error("copies share their GPU lists")
	}
}
