package controller

import (
	"context"
	"fmt"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// Sync looks at one claim: places it, times its allocation out, or releases it.
func (c *Controller) Sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.pending, key)
		delete(c.firstLook, key)
		c.mu.Unlock()
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !c.isOurs(claim) {
		return 0, nil
	}
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim))
	ctx = klog.NewContext(ctx, logger)
	if claim.DeletionTimestamp != nil {
		c.mu.Lock()
		delete(c.pending, key)
		delete(c.firstLook, key)
		c.mu.Unlock()
		return 0, c.finishDeletion(ctx, claim)
	}
	if claim.Status.Allocation != nil {
		c.mu.Lock()
		delete(c.pending, key)
		delete(c.firstLook, key)
		leftQueue := false
		if q := c.quotaWait[ns]; q != nil {
			if _, ok := q[key]; ok {
				delete(q, key)
				leftQueue = true
			}
		}
		c.mu.Unlock()
		if leftQueue {
			c.requeueNamespace(ns, key)
		}
		return c.checkAllocated(ctx, claim)
	}
	return c.place(ctx, claim)
}

func (c *Controller) place(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	key := claim.Namespace + "/" + claim.Name
	pods := c.consumers(claim)
	in := &input{claim: claim, nodeFit: map[string]error{}, classes: map[string]*resourceapi.DeviceClass{}}
	var podLabels map[string]string
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			in.bound = p.Spec.NodeName
		} else {
			in.pods = append(in.pods, p)
		}
		if podLabels == nil {
			podLabels = p.Labels
			if podLabels == nil {
				podLabels = map[string]string{}
			}
		}
	}
	c.mu.Lock()
	if _, ok := c.pending[key]; !ok {
		c.pending[key] = claim.CreationTimestamp.Time
	}
	if _, ok := c.firstLook[key]; !ok {
		c.firstLook[key] = firstLook{at: c.now()}
	}
	c.mu.Unlock()
	if len(pods) == 0 {
		return 0, nil // placed once a pod uses it (pod events requeue the claim)
	}
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if cl, err := c.classes.Get(a.class); err == nil {
				in.classes[a.class] = cl
			}
		}
	}
	var nsLabels map[string]string
	if nsObj, err := c.nsLister.Get(claim.Namespace); err == nil {
		nsLabels = nsObj.Labels
	}
	if nsLabels == nil {
		nsLabels = map[string]string{}
	}

	start := c.now()
	c.mu.Lock()
	if rec := c.st.claims[key]; rec != nil {
		// The state holds an allocation the informer has not shown yet (our own write):
		// never decide twice for one claim. A record the informer contradicts for long is
		// dropped (account keeps fresh ones only).
		if rec.assumed.IsZero() || c.now().Sub(rec.assumed) < 30*time.Second {
			c.markDecided(key)
			c.mu.Unlock()
			return 100 * time.Millisecond, nil
		}
		c.st.remove(key)
	}
	pols := make([]*api.SharingPolicy, 0, len(c.policies))
	for _, p := range c.policies {
		pols = append(pols, p)
	}
	in.pol = policy.Resolve(pols, nsLabels, podLabels)
	in.avoid = map[string]bool{}
	for _, p := range pods {
		for n := range c.avoid[p.UID] {
			in.avoid[n] = true
		}
	}
	// Quota queue: strict FIFO per namespace, as Kueue's StrictFIFO.
	var d *decision
	var w *waitReason
	if in.pol.QuotaMemory != nil || in.pol.QuotaCompute != nil {
		if c.olderClaimUndecided(claim) {
			// With workers in parallel a younger claim can get here first: let the older
			// one be looked at, or the younger could take quota it needs.
			c.mu.Unlock()
			return 50 * time.Millisecond, nil
		}
		for other, created := range c.quotaWait[claim.Namespace] {
			if other != key && (created.Before(claim.CreationTimestamp.Time) || (created.Equal(claim.CreationTimestamp.Time) && other < key)) {
				w = &waitReason{reason: ReasonQuotaQueued, message: fmt.Sprintf("queued behind claim %s, which waits for quota in namespace %s (claims are placed in creation order)", other, claim.Namespace)}
				break
			}
		}
	}
	if w == nil {
		d, w = c.decide(ctx, in)
	}
	// Decided only now, in the same critical section that queues it for quota: a
	// younger claim that saw it decided earlier could take the quota it waits for.
	c.markDecided(key)
	leftQueue := false
	if w != nil && w.quota {
		if c.quotaWait[claim.Namespace] == nil {
			c.quotaWait[claim.Namespace] = map[string]time.Time{}
		}
		c.quotaWait[claim.Namespace][key] = claim.CreationTimestamp.Time
	} else if q := c.quotaWait[claim.Namespace]; q != nil {
		// Placed, or waiting for something else than quota: claims queued behind it go on.
		if _, ok := q[key]; ok {
			delete(q, key)
			leftQueue = true
		}
	}
	if w == nil {
		for _, p := range in.pods {
			c.setAssumed(p.UID, assumedPod{node: d.node, req: podfit.PodRequests(p), at: c.now()})
		}
	}
	c.mu.Unlock()
	c.metrics.decision.Observe(c.now().Sub(start).Seconds())
	if leftQueue {
		c.requeueNamespace(claim.Namespace, key)
	}

	if w != nil {
		logger.V(4).Info("Claim waits", "reason", w.reason, "message", w.message)
		c.setStatus(ctx, claim, pods, "Pending: "+w.message, w.reason)
		if w.quota {
			return 0, nil // requeued when quota frees up
		}
		return 0, nil // requeued on any capacity, node or policy change
	}
	msg := describe(d)
	if err := c.write(ctx, claim, d, "Allocated: "+msg); err != nil {
		c.mu.Lock()
		c.st.remove(claimKey(claim))
		for _, p := range in.pods {
			c.dropAssumed(p.UID)
		}
		c.mu.Unlock()
		c.kick()
		return 0, err
	}
	c.mu.Lock()
	delete(c.pending, key)
	delete(c.firstLook, key)
	c.mu.Unlock()
	c.metrics.placed.Inc()
	c.metrics.latency.Observe(c.now().Sub(claim.CreationTimestamp.Time).Seconds())
	logger.V(2).Info("Placed claim", "node", d.node, "summary", msg)
	written := claim.DeepCopy() // its status annotation went out with the finalizer
	if written.Annotations == nil {
		written.Annotations = map[string]string{}
	}
	written.Annotations[AnnotationStatus] = "Allocated: " + msg
	c.setStatus(ctx, written, pods, "Allocated: "+msg, ReasonPlaced)
	return c.cfg.BindTimeout, nil
}

// describe is the placement in words: "placed on node-1/gpu-3: 10Gi, 12% compute, MPS
// (domain ns-a), 2 co-tenants".
func describe(d *decision) string {
	parts := make([]string, 0, len(d.results))
	for _, r := range d.results {
		s := fmt.Sprintf("placed on %s: ", r.gpu.key)
		if r.whole {
			s += "whole GPU (" + fmtBytes(r.mem) + ")"
		} else {
			s += fmt.Sprintf("%s, %d%% compute, %s (domain %s), %d co-tenant(s)", fmtBytes(r.mem), r.comp, modeName(r.mode), r.domain, r.coTenants)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + " [" + d.pol.DisplayName() + "]"
}

func modeName(m api.SharingMode) string {
	if m == api.SharingModeTimeSlicing {
		return "time-slicing (memory not enforced)"
	}
	return "MPS"
}

// markDecided records that the controller has decided on a claim (placed it or made it
// wait); c.mu must be held.
func (c *Controller) markDecided(key string) {
	fl := c.firstLook[key]
	fl.decided = true
	c.firstLook[key] = fl
}

// firstLook is when the controller first looked at a claim and whether it has decided on it.
type firstLook struct {
	at      time.Time
	decided bool
}

// olderClaimUndecided reports whether an older unallocated claim of the namespace has not
// been decided on yet: never looked at, or looked at before its pod existed (a template's
// claim precedes its pod by a moment). A claim without a pod holds the queue for a few
// seconds only, so an unused standalone claim cannot block its namespace. Call with c.mu held.
func (c *Controller) olderClaimUndecided(claim *resourceapi.ResourceClaim) bool {
	list, err := c.claims.ResourceClaims(claim.Namespace).List(labels.Everything())
	if err != nil {
		return false
	}
	for _, o := range list {
		if o.UID == claim.UID || o.Status.Allocation != nil || o.DeletionTimestamp != nil || !c.isOurs(o) {
			continue
		}
		older := o.CreationTimestamp.Before(&claim.CreationTimestamp) ||
			(o.CreationTimestamp.Equal(&claim.CreationTimestamp) && o.Name < claim.Name)
		if !older {
			continue
		}
		fl, seen := c.firstLook[claimKey(o)]
		if !seen || (!fl.decided && c.now().Sub(fl.at) < 5*time.Second) {
			return true
		}
	}
	return false
}
