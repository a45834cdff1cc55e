package controller

import (
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// policies lists the SharingPolicies (none without an fgpu client).
func (c *Controller) policyList() []*api.SharingPolicy {
	if c.policies == nil {
		return nil
	}
	list, err := c.policies.List(labels.Everything())
	if err != nil {
		return nil
	}
	return list
}

// schedPolicy is the placement core's policy for a latency class: critical claims spread
// over the least-loaded GPUs, best-effort ones pack onto the fullest, standard ones use the
// configured policy.
func (c *Controller) schedPolicy(l api.LatencyClass) placement.Policy {
	switch l {
	case api.LatencyCritical:
		return placement.Spread{}
	case api.LatencyBestEffort:
		return placement.Pack{}
	}
	p, err := placement.New(c.cfg.Placement, defaultWorkload())
	if err != nil { // the allocator's flags refuse unknown policies; a test's config gets the default
		p = placement.NewFGPU(defaultWorkload(), placement.DefaultOptions())
	}
	return p
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
