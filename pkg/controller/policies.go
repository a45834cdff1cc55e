package controller

import (
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// spread places a critical claim on the least-loaded GPU (most free share after it), and
// on the node whose chosen GPU is least loaded.
type spread struct{}

func (spread) Name() string              { return "spread" }
func (spread) Attach(*placement.Cluster) {}
func (spread) Score(c *placement.Cluster, n int, r *placement.Request, elig, out []int) (float64, []int) {
	return pick(c, n, r, elig, out, true)
}

// pack places a best-effort claim on the fullest GPU that still fits it.
type pack struct{}

func (pack) Name() string              { return "pack" }
func (pack) Attach(*placement.Cluster) {}
func (pack) Score(c *placement.Cluster, n int, r *placement.Request, elig, out []int) (float64, []int) {
	return pick(c, n, r, elig, out, false)
}

// pick chooses r.GPUs of the eligible GPUs, most free first (spread) or least free first
// (pack), and scores the node by the free share its chosen GPUs keep.
func pick(c *placement.Cluster, n int, r *placement.Request, elig, out []int, most bool) (float64, []int) {
	free, capa := c.GPUs(n)
	chosen := append([]int(nil), elig...)
	// Selection sort of the first r.GPUs: elig is at most a node's GPUs.
	k := max(r.GPUs, 1)
	for i := 0; i < k && i < len(chosen); i++ {
		b := i
		for j := i + 1; j < len(chosen); j++ {
			if (most && free[chosen[j]] > free[chosen[b]]) || (!most && free[chosen[j]] < free[chosen[b]]) {
				b = j
			}
		}
		chosen[i], chosen[b] = chosen[b], chosen[i]
	}
	chosen = chosen[:min(k, len(chosen))]
	var left, total float64
	for _, g := range chosen {
		take := r.Share
		if r.Whole() || take >= capa[g] {
			take = capa[g]
		}
		left += float64(free[g] - take)
		total += float64(capa[g])
	}
	score := 0.0
	if total > 0 {
		score = left / total
	}
	if !most {
		score = -score
	}
	return score, append(out, chosen...)
}

// defaultWorkload is the shape distribution the fragmentation-aware policy measures
// against: shares of an eighth, a quarter, a half and a whole GPU.
func defaultWorkload() placement.Workload {
	return placement.Workload{
		{GPUs: 1, Share: 125, Weight: 0.3},
		{GPUs: 1, Share: 250, Weight: 0.3},
		{GPUs: 1, Share: 500, Weight: 0.2},
		{GPUs: 1, Share: 1000, Weight: 0.2},
	}
}
