package adoption

import (
	"fmt"
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// BenchmarkSummarize is the allocator's count of the before and after (every minute) at the
// sizes docs/performance.md measures the allocator at: 1,000 and 10,917 nodes of 8 GPUs.
func BenchmarkSummarize(b *testing.B) {
	for _, sz := range []struct{ nodes, shares int }{{1000, 8000}, {10917, 20000}} {
		b.Run(fmt.Sprint(sz.nodes), func(b *testing.B) {
			var gpus []*GPU
			for n := 0; n < sz.nodes; n++ {
				for g := 0; g < 8; g++ {
					gpus = append(gpus, &GPU{Node: fmt.Sprintf("node-%05d", n), Device: fmt.Sprintf("gpu-%d", g), Product: "H100", Memory: 80 << 30})
				}
			}
			var shares []Share
			for i := 0; i < sz.shares; i++ {
				w := api.SizingWorkload{Namespace: fmt.Sprintf("ns-%d", i%50), Kind: "Deployment", Name: fmt.Sprintf("w-%d", i%2000), Request: "gpu"}
				shares = append(shares, Share{Workload: w, GPUs: []*GPU{gpus[i%len(gpus)]}, Held: 10 << 30, Use: &api.ShareUsage{}})
			}
			rec := func(w api.SizingWorkload) (api.SizingRecommendation, time.Time, bool) {
				return api.SizingRecommendation{MemoryBytes: 6 << 30}, time.Now(), true
			}
			for b.Loop() {
				if _, err := Summarize(gpus, shares, Observed{}, rec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
