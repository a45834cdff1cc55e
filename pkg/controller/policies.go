package controller

import (
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// policies lists the SharingPolicies (none without an fgpu client).
func (l *listers) policyList() []*api.SharingPolicy {
	if l.policies == nil {
		return nil
	}
	list, err := l.policies.List(labels.Everything())
	if err != nil {
		return nil
	}
	return list
}

// policyOf is the policy that applies to a claim used by pod, as placing it resolves it.
func (l *listers) policyOf(claim *resourceapi.ResourceClaim, pod *corev1.Pod) policy.Effective {
	nsLabels := map[string]string{}
	if ns, err := l.namespaces.Get(claim.Namespace); err == nil && ns.Labels != nil {
		nsLabels = ns.Labels
	}
	podLabels := pod.Labels
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	return policy.Resolve(l.policyList(), nsLabels, podLabels)
}

// schedPolicy is the placement core's policy for a latency class: critical claims spread
// over the least-loaded GPUs, best-effort ones pack onto the fullest, standard ones use the
// configured policy, measuring against workload w (learned from the claims seen).
func (c *Controller) schedPolicy(l api.LatencyClass, w placement.Workload) placement.Policy {
	switch l {
	case api.LatencyCritical:
		return placement.Spread{}
	case api.LatencyBestEffort:
		return placement.Pack{}
	}
	p, err := placement.New(c.cfg.Placement, w)
	if err != nil { // the allocator's flags refuse unknown policies; a test's config gets the default
		p = placement.NewFGPU(w, placement.DefaultOptions())
	}
	return p
}

// allocatable is a Node's allocatable CPU (milli-cores) and memory (MiB) for the placement
// core: none without a Node object (pod fit refuses the node then), and a resource the
// Node does not report is not limited, as in pod fit.
func (c *Controller) allocatable(name string) (cpuMilli, memMiB int64) {
	node, err := c.nodes.Get(name)
	if err != nil {
		return 0, 0
	}
	cpuMilli, memMiB = unlimited, unlimited
	if q, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		cpuMilli = q.MilliValue()
	}
	if q, ok := node.Status.Allocatable[corev1.ResourceMemory]; ok {
		memMiB = q.Value() >> 20
	}
	return cpuMilli, memMiB
}

// unlimited stands for a resource a Node does not report: more than any node has, and
// small enough for the core's arithmetic.
const unlimited = int64(1) << 31

// requested is what bound and assumed pods request on a node.
func (c *Controller) requested(name string) podfit.Requests { return c.ledger.Requested(name, nil) }

// changedNodes are the nodes whose Node or pods changed since it was last asked.
func (c *Controller) changedNodes() []string { return c.ledger.TakeChanged() }
