package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Two 400m pods spread over two GPUs could share one: the bound frees a GPU.
// Two 600m pods could not: it frees none.
func TestWasteRepacking(t *testing.T) {
	for _, tc := range []struct {
		share       int64
		repackGPUs  int
		partialGPUs float64
	}{{400, 1, 1.2}, {600, 2, 0.8}} {
		c, err := placement.NewCluster([]placement.NodeSpec{{Name: "n0", CPUMilli: 8000, MemoryMiB: 1024,
			GPUs: []placement.GPUSpec{{Model: "T4"}, {Model: "T4"}, {Model: "T4"}}}})
		if err != nil {
			t.Fatal(err)
		}
		log := newFracLog()
		r := &placement.Request{CPUMilli: 1000, GPUs: 1, Share: tc.share}
		for g := range 2 {
			p := placement.Placement{Node: 0, GPUs: []int{g}, Share: []int64{tc.share}}
			if err := c.Assign(p, r); err != nil {
				t.Fatal(err)
			}
			log.add(c, p)
		}
		w := log.waste(c, 0, 0)
		if w.WholeGPUs != 1 || math.Abs(w.PartialGPUs-tc.partialGPUs) > 1e-9 || w.SharedGPUs != 2 || w.RepackGPUs != tc.repackGPUs {
			t.Errorf("share %d: waste %+v, want 1 whole, %.1f partial, 2 shared, %d after repacking",
				tc.share, w, tc.partialGPUs, tc.repackGPUs)
		}
	}
}

// Every free GPU is counted once, and the repacking bound lies between what
// the policy reached and a full cluster.
func TestRunSplitsUnallocatedGPUs(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := ReadPods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" +
		"a,2000,1024,1,600\nb,2000,1024,1,300\nc,2000,1024,1,450\nd,4000,1024,1,1000\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pol := range []string{"random", "fgpu"} {
		res, err := Run(Config{Nodes: nodes, Pods: pods, Policy: pol, Seed: 3, Tune: 1.3})
		if err != nil {
			t.Fatal(err)
		}
		w := res.Waste
		if free := 10 * (1 - res.Final.Alloc); math.Abs(w.WholeGPUs+w.PartialGPUs-free) > 1e-6 {
			t.Errorf("%s: %.2f whole + %.2f partial GPUs, want %.2f free", pol, w.WholeGPUs, w.PartialGPUs, free)
		}
		if w.RepackGPUs < 0 || w.RepackGPUs > w.SharedGPUs || w.RepackAlloc < res.Final.Alloc || w.RepackAlloc > 1 {
			t.Errorf("%s: waste %+v, final allocation %.3f", pol, w, res.Final.Alloc)
		}
	}
}
