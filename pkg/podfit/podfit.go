// Package podfit checks, before fgpu's allocator pins a claim to a node, what kube-scheduler
// will check for the claim's pod on that node: node selector and required affinity, taints,
// unschedulable, and allocatable CPU, memory and pod count. A claim pinned to a node the pod
// cannot run on is never used (kube-scheduler leaves such an allocation in place forever), so
// the allocator must not choose one. The rules are upstream's (component-helpers), not ours.
package podfit

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcehelper "k8s.io/component-helpers/resource"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// Requests is what pods ask of a node.
type Requests struct {
	MilliCPU int64
	Memory   int64
	Pods     int64
}

// Sub subtracts b from r.
func (r *Requests) Sub(b Requests) {
	r.MilliCPU -= b.MilliCPU
	r.Memory -= b.Memory
	r.Pods -= b.Pods
}

// Add adds b to r.
func (r *Requests) Add(b Requests) {
	r.MilliCPU += b.MilliCPU
	r.Memory += b.Memory
	r.Pods += b.Pods
}

// PodRequests is what one pod asks of its node, computed as kube-scheduler does (init
// containers, sidecars, pod-level resources and overhead included).
func PodRequests(pod *corev1.Pod) Requests {
	reqs := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	return Requests{MilliCPU: reqs.Cpu().MilliValue(), Memory: reqs.Memory().Value(), Pods: 1}
}

// Counts reports whether a pod holds node resources: bound and not finished.
func Counts(pod *corev1.Pod) bool {
	return pod.Spec.NodeName != "" && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// Fits returns nil when pod may run on node given what is already requested there, or an
// error that says, in kube-scheduler's words where it has them, why not.
func Fits(pod *corev1.Pod, node *corev1.Node, requested Requests) error {
	return NewChecker(pod).Fits(node, requested)
}

// Checker is Fits for one pod against many nodes: the pod's requests and node affinity
// are worked out once, not once per node.
type Checker struct {
	pod      *corev1.Pod
	affinity nodeaffinity.RequiredNodeAffinity
	// Requests is what the pod asks of its node.
	Requests Requests
	key      string
}

// NewChecker prepares pod for Fits.
func NewChecker(pod *corev1.Pod) *Checker {
	return &Checker{pod: pod, affinity: nodeaffinity.GetRequiredNodeAffinity(pod), Requests: PodRequests(pod)}
}

// Fits is the package's Fits for the checker's pod.
func (c *Checker) Fits(node *corev1.Node, requested Requests) error {
	if err := c.FitsNode(node); err != nil {
		return err
	}
	return c.FitsResources(node, requested)
}

// FitsNode is the part of Fits that depends on the Node object only: unschedulable, node
// affinity and selector, taints. Its verdict holds for every pod with the same
// ConstraintsKey for as long as the Node object is the same.
func (c *Checker) FitsNode(node *corev1.Node) error {
	pod := c.pod
	if node.Spec.Unschedulable {
		t := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
		if !corev1helpers.TolerationsTolerateTaint(klog.Background(), pod.Spec.Tolerations, &t, false) {
			return fmt.Errorf("node %s is unschedulable", node.Name)
		}
	}
	if ok, err := c.affinity.Match(node); err != nil {
		return fmt.Errorf("node %s: pod's node affinity is invalid: %w", node.Name, err)
	} else if !ok {
		return fmt.Errorf("node %s didn't match the pod's node affinity/selector", node.Name)
	}
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, pod.Spec.Tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
	if untolerated {
		return fmt.Errorf("node %s had untolerated taint {%s: %s}", node.Name, taint.Key, taint.Value)
	}
	return nil
}

// ConstraintsKey identifies what FitsNode looks at in the pod: its node selector, required
// node affinity and tolerations.
func (c *Checker) ConstraintsKey() string {
	if c.key != "" {
		return c.key
	}
	var aff *corev1.NodeSelector
	if a := c.pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		aff = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	b, _ := json.Marshal(struct {
		Selector    map[string]string
		Affinity    *corev1.NodeSelector
		Tolerations []corev1.Toleration
	}{c.pod.Spec.NodeSelector, aff, c.pod.Spec.Tolerations})
	c.key = string(b)
	return c.key
}

// FitsResources is the part of Fits that depends on what is requested on the node:
// allocatable CPU, memory and pod count.
func (c *Checker) FitsResources(node *corev1.Node, requested Requests) error {
	want := c.Requests
	alloc := node.Status.Allocatable
	if cpu, ok := alloc[corev1.ResourceCPU]; ok && requested.MilliCPU+want.MilliCPU > cpu.MilliValue() {
		return fmt.Errorf("node %s has insufficient cpu: %dm requested there, pod needs %dm of %dm allocatable",
			node.Name, requested.MilliCPU, want.MilliCPU, cpu.MilliValue())
	}
	if mem, ok := alloc[corev1.ResourceMemory]; ok && requested.Memory+want.Memory > mem.Value() {
		return fmt.Errorf("node %s has insufficient memory: %d bytes requested there, pod needs %d of %d allocatable",
			node.Name, requested.Memory, want.Memory, mem.Value())
	}
	if pods, ok := alloc[corev1.ResourcePods]; ok && requested.Pods+1 > pods.Value() {
		return fmt.Errorf("node %s has too many pods (%d allocatable)", node.Name, pods.Value())
	}
	return nil
}
