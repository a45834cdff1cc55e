package controller

import (
	"maps"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// handlers are the controller's reactions to informer events: keep the model and the pod
// ledger current, and queue the claims an event may let go on.
func (c *Controller) handlers() eventHandlers {
	kick := func(any) { c.kick() }
	return eventHandlers{
		claim: handlerFuncs(func(cl *resourceapi.ResourceClaim) { c.onClaim(cl) },
			func(_, cl *resourceapi.ResourceClaim) { c.onClaim(cl) }, c.onClaimDelete),
		slice:  handlerFuncs(c.onSlice, func(_, s *resourceapi.ResourceSlice) { c.onSlice(s) }, c.onSlice),
		node:   handlerFuncs(c.onNode, c.onNodeUpdate, c.onNode),
		pod:    handlerFuncs(func(p *corev1.Pod) { c.onPod(nil, p) }, c.onPod, c.onPodDelete),
		policy: handlerFuncs(c.onPolicy, func(_, p *api.SharingPolicy) { c.onPolicy(p) }, func(*api.SharingPolicy) { c.kick() }),
		// c.idle is built after the informers (it reads their listers): looked up per event.
		workload: cache.ResourceEventHandlerFuncs{AddFunc: func(o any) { c.idle.onWorkload(o) }, UpdateFunc: func(_, o any) { c.idle.onWorkload(o) },
			DeleteFunc: func(o any) {
				if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
					o = d.Obj
				}
				c.idle.onWorkload(o)
			}},
		// c.sizing is built after the informers too.
		observed: handlerFuncs(func(cm *corev1.ConfigMap) { c.sizing.observeForeign(cm) },
			func(_, cm *corev1.ConfigMap) { c.sizing.observeForeign(cm) }, nil),
		other: cache.ResourceEventHandlerFuncs{AddFunc: kick, UpdateFunc: func(any, any) { c.kick() }, DeleteFunc: kick},
	}
}

// onPolicy queues a SharingPolicy whose Accepted condition must change (policyStatus
// writes it, with an event if it became invalid: policy.Resolve skips an invalid policy,
// and claims its quota may bind wait), and looks at the pending claims again.
func (c *Controller) onPolicy(p *api.SharingPolicy) {
	if c.policyStatus != nil && acceptedChanged(p) {
		c.policyStatus.queue.Add(p.Name)
	}
	c.kick()
}

func (c *Controller) onClaim(claim *resourceapi.ResourceClaim) {
	ours := c.cfg.isOurs(claim)
	if !ours && claim.Status.Allocation == nil {
		return
	}
	if c.model.Account(claim, c.now()) {
		c.kick()
	}
	if ours {
		c.queue.Add(claimKey(claim))
		c.sizing.observeUsage(claim)
		c.idle.observeIdle(claim)
	}
}

// onClaimDelete forgets a deleted claim, except the shares its pods still run on
// (goneClaims): the claim can go while they run, and their GPU memory stays in use.
func (c *Controller) onClaimDelete(claim *resourceapi.ResourceClaim) {
	key := claimKey(claim)
	if !c.gone.holdIfRunning(claim) && c.model.Release(key) {
		c.kick()
	}
	c.status.memo.Forget(key)
	c.refused.Forget(claim.UID)
	c.restores.forget(claim.UID)
	c.sizing.forgetUsage(claim)
	c.idle.forgetIdle(claim)
	c.forget(key)
	// A worker may be deciding on the claim now and keep state for it after this: its
	// next Sync finds the claim gone and forgets it again.
	c.queue.Add(key)
}

func (c *Controller) onSlice(s *resourceapi.ResourceSlice) {
	if s.Spec.Driver != c.cfg.DriverName {
		return
	}
	node := sliceNode(s)
	objs, _ := c.slicesByNode.ByIndex(indexByKey, node)
	devs := map[string]resourceapi.Device{}
	for _, o := range objs {
		if s, ok := o.(*resourceapi.ResourceSlice); ok && s.Spec.Driver == c.cfg.DriverName {
			for _, d := range s.Spec.Devices {
				devs[d.Name] = d
			}
		}
	}
	c.model.SetNodeDevices(node, devs)
	c.kick()
}

// onNode notes a node that came or went (the placement core reads its allocatable), and
// looks again at pending claims.
func (c *Controller) onNode(n *corev1.Node) {
	c.ledger.NodeChanged(n.Name)
	c.kick()
}

// onNodeUpdate looks again at pending claims when a node changed in a way pod fit sees.
func (c *Controller) onNodeUpdate(old, cur *corev1.Node) {
	cpuChanged := old.Status.Allocatable.Cpu().Cmp(*cur.Status.Allocatable.Cpu()) != 0 ||
		old.Status.Allocatable.Memory().Cmp(*cur.Status.Allocatable.Memory()) != 0
	if cpuChanged {
		c.ledger.NodeChanged(cur.Name)
	}
	if cpuChanged || old.Spec.Unschedulable != cur.Spec.Unschedulable || len(old.Spec.Taints) != len(cur.Spec.Taints) ||
		!maps.Equal(old.Labels, cur.Labels) {
		c.kick()
	}
}

func (c *Controller) onPod(old, pod *corev1.Pod) {
	c.ledger.Bound(pod, false)
	c.gone.recheck(pod)
	if old != nil && podfit.Counts(old) && !podfit.Counts(pod) {
		c.kick() // the pod finished: its node's CPU and memory are free
	}
	for _, n := range podClaimNames(pod) {
		c.queue.Add(claimKeyIn(pod.Namespace, n))
	}
	// Template claims: the claim is owned by the pod; it is placed once its pod is ungated.
	if old == nil || len(old.Status.ResourceClaimStatuses) != len(pod.Status.ResourceClaimStatuses) ||
		len(old.Spec.SchedulingGates) != len(pod.Spec.SchedulingGates) {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				c.queue.Add(claimKeyIn(pod.Namespace, *s.ResourceClaimName))
			}
		}
	}
}

func (c *Controller) onPodDelete(pod *corev1.Pod) {
	c.ledger.Bound(pod, true)
	c.gone.recheck(pod)
	for _, n := range podClaimNames(pod) {
		c.queue.Add(claimKeyIn(pod.Namespace, n))
	}
	c.kick()
}

// consumers returns the live pods that use a claim: by name in their spec or status, or as
// the claim's owner.
func (l *listers) consumers(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	out := l.claimPods(claim)
	live := out[:0]
	for _, p := range out {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live = append(live, p)
		}
	}
	return live
}

// claimPods returns the pods that use a claim, finished and deleted ones too.
func (l *listers) claimPods(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	seen := map[types.UID]bool{}
	var out []*corev1.Pod
	objs, _ := l.podsByClaim.ByIndex(indexByKey, claimKey(claim))
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	for _, ref := range claim.OwnerReferences {
		if ref.Kind != "Pod" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		if p, err := l.pods.Pods(claim.Namespace).Get(ref.Name); err == nil && p.UID == ref.UID && !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	return out
}
