package sim

import (
	"bytes"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// FuzzReadTrace feeds arbitrary CSV to the trace readers: they fail with an error or return
// nodes and pods within the bounds they promise.
func FuzzReadTrace(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		if nodes, err := ReadNodes(bytes.NewReader(raw)); err == nil {
			if len(nodes) == 0 {
				t.Fatal("no nodes and no error")
			}
			for _, n := range nodes {
				if n.CPUMilli < 0 || n.MemoryMiB < 0 || len(n.GPUs) > 64 {
					t.Fatalf("node out of bounds: %+v", n)
				}
				for _, g := range n.GPUs {
					if g.Model == "" || g.Capacity != placement.DefaultGPUCapacity {
						t.Fatalf("GPU without a model or with capacity %d: %+v", g.Capacity, n)
					}
				}
			}
		}
		pods, err := ReadPods(bytes.NewReader(raw))
		if err != nil {
			return
		}
		if len(pods) == 0 {
			t.Fatal("no pods and no error")
		}
		for _, p := range pods {
			if p.CPUMilli < 0 || p.MemoryMiB < 0 || p.GPUs < 0 || p.GPUs > 64 {
				t.Fatalf("pod out of bounds: %+v", p)
			}
			if p.Share < 0 || p.Share >= placement.DefaultGPUCapacity || (p.Share > 0 && p.GPUs == 0) {
				t.Fatalf("pod with share %d of %d GPUs", p.Share, p.GPUs)
			}
			if p.GPUs == 0 && len(p.Models) > 0 {
				t.Fatalf("a pod without GPUs names models %v", p.Models)
			}
		}
	})
}
