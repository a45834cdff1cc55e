package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// checkAllocated watches an allocation the allocator made: it takes it back when no pod
// uses the claim any more, or when its pod was not scheduled within BindTimeout (then the
// claim is placed again, away from that node for that pod).
func (c *Controller) checkAllocated(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	if !PlacedByAllocator(c.cfg.DriverName, claim) {
		return 0, nil // kube-scheduler's: only accounted
	}
	if !hasFinalizer(claim, api.FinalizerAllocator) {
		restored, err := c.restoreFinalizer(ctx, claim)
		if err != nil {
			return 0, err
		}
		claim = restored
	}
	if _, marked := claim.Annotations[api.AnnotationReclaimed]; marked && !c.reclaim.reclaiming(claim.UID) {
		// Its reclamation ended without releasing it: its pods may reserve it again.
		if err := c.reclaim.unmark(ctx, claim); err != nil {
			return 0, fmt.Errorf("clearing %s: %w", api.AnnotationReclaimed, err)
		}
	}
	if g, cond := prepareRefusal(c.cfg.DriverName, claim); cond != nil {
		return c.replace(ctx, claim, g, cond)
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
	node := allocatedNode(claim.Status.Allocation)
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
	c.ledger.Avoid(pods, node)
	return 0, c.deallocate(ctx, claim, pods, msg)
}

// deallocate clears an allocation the allocator made.
func (c *Controller) deallocate(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, why string) error {
	if err := c.fenced(); err != nil {
		return err
	}
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.Devices = nil
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("deallocate: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Deallocated claim", "why", why)
	c.model.Release(claimKey(claim))
	reason := ReasonDeallocated
	if pods != nil {
		reason = ReasonTimedOut
	}
	c.recorder.Event(claim, corev1.EventTypeWarning, reason, why)
	for _, p := range pods {
		c.recorder.Event(p, corev1.EventTypeWarning, reason, fmt.Sprintf("claim %s: %s", claim.Name, why))
	}
	c.kick()
	c.queue.Add(claimKey(claim))
	return nil
}

// restoreInterval is the least time between two restores of one claim's finalizer: a
// tenant that keeps removing it gets an Update and an event at most this often, not one
// per removal.
const restoreInterval = time.Minute

// restoreFinalizer adds the allocator's finalizer back to a claim it placed that lost it
// (someone removed it): without it a deleted claim could go before its shares are released.
// It does so at most once per restoreInterval per claim; meanwhile the claim is left as it
// is and looked at again when the interval has passed.
func (c *Controller) restoreFinalizer(ctx context.Context, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error) {
	logger := klog.FromContext(ctx)
	if wait := c.restores.wait(claim.UID, c.now()); wait > 0 {
		logger.Info("The allocator's finalizer was removed again; restoring it later", "finalizer", api.FinalizerAllocator, "after", wait)
		c.queue.AddAfter(claimKey(claim), wait)
		return claim, nil
	}
	if err := c.fenced(); err != nil {
		return nil, err
	}
	cl := claim.DeepCopy()
	cl.Finalizers = append(cl.Finalizers, api.FinalizerAllocator)
	updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return nil, fmt.Errorf("restore finalizer: %w", err)
	}
	c.restores.done(claim.UID, c.now())
	msg := fmt.Sprintf("the allocator's finalizer %s was removed from a claim it placed; added it back (it keeps the claim until its GPU shares are released)", api.FinalizerAllocator)
	logger.Info("Restored the allocator's finalizer", "finalizer", api.FinalizerAllocator)
	c.recorder.Event(claim, corev1.EventTypeWarning, ReasonFinalizerRestored, msg)
	return updated, nil
}

// finalizerRestores remembers when each claim's finalizer was last restored.
type finalizerRestores struct {
	mu   sync.Mutex
	last map[types.UID]time.Time
}

func newFinalizerRestores() *finalizerRestores {
	return &finalizerRestores{last: map[types.UID]time.Time{}}
}

// wait is how long a claim's finalizer must wait before it is restored again (0: now).
func (r *finalizerRestores) wait(uid types.UID, now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if at, ok := r.last[uid]; ok {
		return max(at.Add(restoreInterval).Sub(now), 0)
	}
	return 0
}

func (r *finalizerRestores) done(uid types.UID, now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[uid] = now
}

func (r *finalizerRestores) forget(uid types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.last, uid)
}

// finishDeletion releases a deleted claim's allocation (once no pod holds it) and drops
// the allocator's finalizer. A claim the allocator placed is released even when its
// finalizer was removed (kube-controller-manager's may still hold it).
func (c *Controller) finishDeletion(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	ours := hasFinalizer(claim, api.FinalizerAllocator)
	if !ours && !PlacedByAllocator(c.cfg.DriverName, claim) {
		return nil
	}
	if len(claim.Status.ReservedFor) > 0 {
		return nil // kube-controller-manager removes consumers that are gone; we see the update
	}
	if err := c.fenced(); err != nil {
		return err
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
		c.model.Release(claimKey(claim))
		c.kick()
	}
	if !ours {
		return nil
	}
	cl.Finalizers = slices.DeleteFunc(cl.Finalizers, func(f string) bool { return f == api.FinalizerAllocator })
	if err := c.fenced(); err != nil {
		return err
	}
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// allocatedNode is the node an allocation the allocator wrote pins its claim to.
func allocatedNode(a *resourceapi.AllocationResult) string {
	if a == nil || a.NodeSelector == nil || len(a.NodeSelector.NodeSelectorTerms) != 1 {
		return ""
	}
	t := a.NodeSelector.NodeSelectorTerms[0]
	if len(t.MatchFields) != 1 || len(t.MatchFields[0].Values) != 1 {
		return ""
	}
	return t.MatchFields[0].Values[0]
}
