package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// policySet holds the SharingPolicies the allocator places claims under.
type policySet struct {
	mu       sync.Mutex
	policies map[string]*api.SharingPolicy
}

func newPolicySet() *policySet { return &policySet{policies: map[string]*api.SharingPolicy{}} }

// List returns the policies (shared: do not modify them).
func (s *policySet) List() []*api.SharingPolicy {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*api.SharingPolicy, 0, len(s.policies))
	for _, p := range s.policies {
		out = append(out, p)
	}
	return out
}

// Set adds or replaces a policy.
func (s *policySet) Set(p *api.SharingPolicy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policies[p.Name] = p.DeepCopy()
}

// SetUnstructured adds or replaces a policy as the dynamic informer shows it.
func (s *policySet) SetUnstructured(u *unstructured.Unstructured) {
	var p api.SharingPolicy
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		utilruntime.HandleError(err)
		return
	}
	s.Set(&p)
}

// Delete forgets a policy.
func (s *policySet) Delete(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.policies, name)
}

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
