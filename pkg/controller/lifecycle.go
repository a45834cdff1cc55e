package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// checkAllocated watches an allocation the allocator made: it takes it back when no pod
// uses the claim any more, or when its pod was not scheduled within BindTimeout (then the
// claim is placed again, away from that node for that pod).
func (c *Controller) checkAllocated(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	if claim.Annotations[AnnotationAllocatedBy] != AllocatedByValue || !hasFinalizer(claim, Finalizer) {
		return 0, nil // kube-scheduler's: only accounted
	}
	if len(claim.Status.ReservedFor) > 0 {
		return 0, nil // in use; kube-controller-manager deallocates it when its pods are gone
	}
	at := claim.CreationTimestamp.Time
	if a := claim.Status.Allocation.AllocationTimestamp; a != nil {
		at = a.Time
	}
	age := c.now().Sub(at)
	pods := c.consumers(claim)
	if len(pods) == 0 {
		if age < c.cfg.OrphanGrace {
			return c.cfg.OrphanGrace - age, nil
		}
		return 0, c.deallocate(ctx, claim, nil, "no pod uses the claim any more")
	}
	if age < c.cfg.BindTimeout {
		return c.cfg.BindTimeout - age, nil
	}
	node := ""
	if a := claim.Status.Allocation; a != nil && a.NodeSelector != nil && len(a.NodeSelector.NodeSelectorTerms) == 1 &&
		len(a.NodeSelector.NodeSelectorTerms[0].MatchFields) == 1 && len(a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values) == 1 {
		node = a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0]
	}
	why := ""
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			return c.cfg.BindTimeout, nil // bound; the scheduler reserves it
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Message != "" {
				why = cond.Message
			}
		}
	}
	msg := fmt.Sprintf("the pod was not scheduled to node %s within %s", node, c.cfg.BindTimeout)
	if why != "" {
		msg += " (kube-scheduler: " + why + ")"
	}
	msg += "; placing the claim again elsewhere"
	c.mu.Lock()
	for _, p := range pods {
		if c.avoid[p.UID] == nil {
			c.avoid[p.UID] = map[string]bool{}
		}
		c.avoid[p.UID][node] = true
		c.dropAssumed(p.UID)
	}
	c.mu.Unlock()
	if err := c.deallocate(ctx, claim, pods, msg); err != nil {
		return 0, err
	}
	return 0, nil
}

// deallocate clears an allocation the allocator made.
func (c *Controller) deallocate(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, why string) error {
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.Devices = nil
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("deallocate: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Deallocated claim", "why", why)
	c.mu.Lock()
	c.st.remove(claimKey(claim))
	c.mu.Unlock()
	reason := ReasonDeallocated
	if pods != nil {
		reason = ReasonTimedOut
	}
	c.recorder.Event(claim, corev1.EventTypeWarning, reason, why)
	for _, p := range pods {
		c.recorder.Event(p, corev1.EventTypeWarning, reason, fmt.Sprintf("claim %s: %s", claim.Name, why))
	}
	c.kick()
	c.queue.Add(claim.Namespace + "/" + claim.Name)
	return nil
}

// finishDeletion releases a deleted claim's allocation (once no pod holds it) and drops
// the allocator's finalizer.
func (c *Controller) finishDeletion(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	if !hasFinalizer(claim, Finalizer) {
		return nil
	}
	if len(claim.Status.ReservedFor) > 0 {
		return nil // kube-controller-manager removes consumers that are gone; we see the update
	}
	cl := claim.DeepCopy()
	if cl.Status.Allocation != nil {
		cl.Status.Allocation = nil
		cl.Status.Devices = nil
		updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("deallocate deleted claim: %w", err)
		}
		cl = updated
		c.mu.Lock()
		c.st.remove(claimKey(claim))
		c.mu.Unlock()
		c.kick()
	}
	fs := cl.Finalizers[:0]
	for _, f := range cl.Finalizers {
		if f != Finalizer {
			fs = append(fs, f)
		}
	}
	cl.Finalizers = fs
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// setStatus tells people where a claim stands: events on its pods (and, for a claim that
// waits, on the claim) and the status annotation, each only when the message changed. A
// placement is not repeated as an event on the claim: the annotation says it, and under a
// burst every write counts (the API server is what limits placements per second).
func (c *Controller) setStatus(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, msg string, reason ...string) {
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	same := c.lastMsg[key] == msg
	c.lastMsg[key] = msg
	c.mu.Unlock()
	if same {
		return
	}
	if len(reason) > 0 {
		typ := corev1.EventTypeNormal
		if reason[0] != ReasonPlaced {
			typ = corev1.EventTypeWarning
		}
		if reason[0] != ReasonPlaced {
			c.recorder.Event(claim, typ, reason[0], msg)
		}
		for _, p := range pods {
			c.recorder.Event(p, typ, reason[0], fmt.Sprintf("claim %s: %s", claim.Name, msg))
		}
	}
	if claim.Annotations[AnnotationStatus] == msg {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationStatus: msg}}})
	if _, err := c.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Patching the claim's status annotation", "claim", klog.KObj(claim))
	}
}

// setAssumed records that the allocator pinned a pod to a node. Caller holds c.mu.
func (c *Controller) setAssumed(uid types.UID, ap assumedPod) {
	c.dropAssumed(uid)
	c.assumedPods[uid] = ap
	addOnNode(c.nodeAssumed, ap.node, ap.req)
}

// dropAssumed forgets a pinned pod. Caller holds c.mu.
func (c *Controller) dropAssumed(uid types.UID) {
	ap, ok := c.assumedPods[uid]
	if !ok {
		return
	}
	delete(c.assumedPods, uid)
	subOnNode(c.nodeAssumed, ap.node, ap.req)
}

// addOnNode and subOnNode keep a per-node sum of requests, without entries for nodes
// whose sum is back to zero.
func addOnNode(m map[string]podfit.Requests, node string, req podfit.Requests) {
	r := m[node]
	r.Add(req)
	m[node] = r
}

func subOnNode(m map[string]podfit.Requests, node string, req podfit.Requests) {
	r := m[node]
	r.Sub(req)
	if r == (podfit.Requests{}) {
		delete(m, node)
	} else {
		m[node] = r
	}
}

type boundPod struct {
	node string
	req  podfit.Requests
}

// trackBound keeps nodeReq current as pods bind, finish or go. Caller holds c.mu.
func (c *Controller) trackBound(pod *corev1.Pod, deleted bool) {
	if b, ok := c.podBound[pod.UID]; ok {
		subOnNode(c.nodeReq, b.node, b.req)
		delete(c.podBound, pod.UID)
	}
	if deleted || !podfit.Counts(pod) {
		return
	}
	b := boundPod{node: pod.Spec.NodeName, req: podfit.PodRequests(pod)}
	c.podBound[pod.UID] = b
	addOnNode(c.nodeReq, b.node, b.req)
}
