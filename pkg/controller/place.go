package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
)

// Sync looks at one claim: places it, times its allocation out, or releases it.
func (c *Controller) Sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.forget(key)
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !c.cfg.isOurs(claim) {
		return 0, nil
	}
	ctx = klog.NewContext(ctx, klog.FromContext(ctx).WithValues("claim", klog.KObj(claim)))
	switch {
	case claim.DeletionTimestamp != nil:
		c.forget(key)
		return 0, c.finishDeletion(ctx, claim)
	case claim.Status.Allocation != nil:
		c.forget(key)
		return c.checkAllocated(ctx, claim)
	}
	return c.place(ctx, claim)
}

// forget takes a claim out of the queue; the claims of its namespace that queued behind it
// for quota are looked at again.
func (c *Controller) forget(key string) {
	c.selectors.Forget(key)
	c.reclaim.forget(key)
	if c.pending.Forget(key) {
		ns, _, _ := strings.Cut(key, "/")
		c.requeueNamespace(ns, key)
	}
}

// place decides where a pending claim goes and writes it: gather what the decision needs,
// pass the namespace's quota queue, decide, and commit (or say why it waits).
func (c *Controller) place(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	key := claimKey(claim)
	if err := c.reclaim.unmark(ctx, claim); err != nil {
		return 0, fmt.Errorf("clearing %s: %w", api.AnnotationReclaimed, err)
	}
	c.pending.Add(key, claim.CreationTimestamp.Time, c.now())
	in, hasPods := c.gather(ctx, claim)
	c.pending.SetPodless(key, !hasPods)
	if !hasPods {
		c.reclaim.forget(key) // no GPU is kept for a claim no pod uses
		// Placed once a pod uses it (pod events requeue the claim); until then it must not
		// hold its namespace's quota queue.
		if c.pending.WaitForQuota(key, claim.CreationTimestamp.Time, false) {
			c.requeueNamespace(claim.Namespace, key)
		}
		return 0, nil
	}
	c.pending.SetClass(key, in.pol.Latency)
	if w := in.selectorsWait; w != nil && w.quiet {
		// Its namespace's other claims go first.
		c.pending.Deferred(key)
		return w.retryAfter, nil
	}
	if wait := c.shares.Wait(claim.Namespace, c.now()); wait > 0 {
		// Its namespace's decisions took their share of the model's lock: others' go
		// first. Its status keeps the reason its last decision gave.
		klog.FromContext(ctx).V(4).Info("Claim waits for its namespace's share of decisions", "after", wait)
		c.pending.Deferred(key)
		return wait, nil
	}
	start := c.now()
	d, w, retry := c.decideInQueue(ctx, in)
	if retry > 0 {
		return retry, nil
	}
	c.metrics.decision.Observe(c.now().Sub(start).Seconds())
	if w != nil {
		klog.FromContext(ctx).V(4).Info("Claim waits", "reason", w.reason, "message", w.message)
		c.metrics.refusedIn(claim.Namespace, w.reason)
		msg := w.message
		if w.reclaim != nil {
			c.reclaim.start(ctx, w.reclaim)
		}
		if w.reason != ReasonWaiting || w.quota || w.beyondQuota {
			c.reclaim.forget(key) // waits for something else than room now
		}
		msg += c.reclaim.status(key)
		if w.quota || w.beyondQuota {
			msg += kueueHint(in.consumers)
		}
		c.status.tell(ctx, claim, in.consumers, "Pending: "+msg, w.reason)
		if w.retryAfter > 0 {
			return w.retryAfter, nil
		}
		// Requeued when quota frees up, or on any capacity, node or policy change; and when
		// a GPU whose plugin refused the claim may be tried again.
		return c.refused.Next(claim.UID, c.now(), c.cfg.BindTimeout), nil
	}
	return c.commit(ctx, in, d)
}

// gather collects what a decision on the claim depends on besides the model: its pods,
// classes, policy and the nodes its pods must avoid. It reports whether any pod uses it.
func (c *Controller) gather(ctx context.Context, claim *resourceapi.ResourceClaim) (*input, bool) {
	in := &input{claim: claim, classes: map[string]*resourceapi.DeviceClass{}}
	in.consumers = c.consumers(claim)
	// A scheduling-gated pod may not run yet (Kueue gates the pods it has not admitted), and
	// kube-scheduler allocates nothing for it either: a share placed for it would hold GPU
	// memory that admitted work cannot have. The claim waits until one of its pods is ungated.
	if !slices.ContainsFunc(in.consumers, func(p *corev1.Pod) bool { return len(p.Spec.SchedulingGates) == 0 }) {
		return in, false
	}
	// A claim placed again after a refused prepare stays on the node its reserved pods are
	// bound to, though the pod informer may not show the binding yet; but only for those
	// pods: once they are gone, a new pod must not wait for the old one's node.
	node, reserved := c.refused.Pinned(claim.UID)
	in.reservedFor = stillConsuming(reserved, in.consumers)
	if len(in.reservedFor) > 0 {
		// It wins over pods bound elsewhere (told so when placed): kube-scheduler bound
		// the reserved pods to it, and their kubelet waits for the claim.
		in.bound = node
	}
	boundTo := map[string][]string{}
	for _, p := range in.consumers {
		switch {
		case p.Spec.NodeName != "":
			boundTo[p.Spec.NodeName] = append(boundTo[p.Spec.NodeName], p.Name)
		case !slices.ContainsFunc(in.reservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == p.UID }):
			in.pods = append(in.pods, p)
		}
	}
	if in.bound == "" {
		in.bound, in.conflict = boundNode(boundTo)
	}
	in.otherClaims = make(map[types.UID][]otherClaim, len(in.consumers))
	for _, p := range in.consumers {
		if others := c.otherClaims(p, claim); len(others) > 0 {
			in.otherClaims[p.UID] = others
		}
	}
	in.gang = gangLevels(&c.listers, c.cfg.GangTopologyKeys, c.cfg.DriverName, in.consumers)
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if cl, err := c.classes.Get(a.class); err == nil {
				in.classes[a.class] = cl
			}
		}
	}
	nsLabels := map[string]string{}
	if ns, err := c.namespaces.Get(claim.Namespace); err == nil && ns.Labels != nil {
		nsLabels = ns.Labels
	}
	podLabels := in.consumers[0].Labels
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	in.pol = policy.Resolve(c.policyList(), nsLabels, podLabels)
	if in.pol.Sizing == api.SizingInitial || in.pol.Sizing == api.SizingAuto {
		top := topOwner(in.consumers[0])
		for _, r := range claim.Spec.Devices.Requests {
			for _, a := range alternatives(r) {
				w := api.SizingWorkload{Namespace: claim.Namespace, Kind: top.Kind, Name: top.Name, Request: a.name}
				if rec, ok := c.sizing.Recommendation(w); ok {
					if in.sized == nil {
						in.sized = map[string]api.SizingRecommendation{}
					}
					in.sized[a.name], in.sizedFor = rec, w
				}
			}
		}
	}
	in.avoid = c.ledger.Avoided(in.consumers)
	c.evaluateSelectors(ctx, in)
	return in, true
}

// evaluateSelectors evaluates every alternative's selectors, its class's and its own, on the
// published GPUs, outside the model's lock: what a tenant's selectors cost holds up no
// other claim's decision (pkg/selectors bounds it per claim and per namespace).
func (c *Controller) evaluateSelectors(ctx context.Context, in *input) {
	claim := in.claim
	var names []string
	var lists [][]resourceapi.DeviceSelector
	hasSelectors := false
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			var sels []resourceapi.DeviceSelector
			if cl := in.classes[a.class]; cl != nil {
				sels = append(sels, cl.Spec.Selectors...)
			}
			sels = append(sels, a.selectors...)
			names, lists, hasSelectors = append(names, a.name), append(lists, sels), hasSelectors || len(sels) > 0
		}
	}
	var snap selectors.Snapshot
	if hasSelectors {
		snap = c.model.SelectorSnapshot()
	}
	matches, err := c.selectors.Claim(ctx, claim.Namespace, claimKey(claim), claim.UID, lists, snap)
	var costly *selectors.TooCostlyError
	var throttled *selectors.ThrottledError
	switch {
	case errors.As(err, &costly):
		in.selectorsWait = &waitReason{reason: ReasonSelectorsTooCostly, message: err.Error()}
	case errors.As(err, &throttled):
		in.selectorsWait = &waitReason{reason: ReasonWaiting, message: err.Error(), retryAfter: throttled.RetryAfter, quiet: throttled.Busy}
	case err != nil:
		in.selectorsWait = &waitReason{reason: ReasonWaiting, message: "device selectors not evaluated: " + err.Error(), retryAfter: time.Second}
	default:
		in.selectors = make(map[string]selectors.Matches, len(names))
		for i, n := range names {
			in.selectors[n] = matches[i]
		}
	}
}

// stillConsuming are the reservations whose pod is still a live consumer of the claim (same
// UID); reservations of other consumers than pods are kept as they are.
func stillConsuming(reserved []resourceapi.ResourceClaimConsumerReference, consumers []*corev1.Pod) []resourceapi.ResourceClaimConsumerReference {
	var out []resourceapi.ResourceClaimConsumerReference
	for _, r := range reserved {
		if r.APIGroup != "" || r.Resource != "pods" ||
			slices.ContainsFunc(consumers, func(p *corev1.Pod) bool { return p.UID == r.UID }) {
			out = append(out, r)
		}
	}
	return out
}

// boundNode is the node the claim's bound pods are on, or why it has none: a tenant may
// bind the pods of one claim (spec.nodeName) to different nodes, and no node serves them
// all.
func boundNode(boundTo map[string][]string) (string, *waitReason) {
	if len(boundTo) < 2 {
		for n := range boundTo {
			return n, nil
		}
		return "", nil
	}
	var on []string
	for _, n := range slices.Sorted(maps.Keys(boundTo)) {
		for _, p := range slices.Sorted(slices.Values(boundTo[n])) {
			on = append(on, p+" on "+n)
		}
	}
	return "", &waitReason{reason: ReasonPodBoundElsewhere, message: fmt.Sprintf(
		"the pods that use the claim are bound to different nodes (%s), but a claim's devices are all on one node: delete the pods bound to the wrong node, or leave spec.nodeName unset and let the scheduler choose",
		strings.Join(on, ", "))}
}

// decideInQueue decides on a claim in its place in the queue, in one model transaction: a
// claim whose namespace has a quota waits for older claims of the namespace, and queues
// for quota in the same step that finds it over quota, so that a younger claim can never
// take the quota an older one waits for. retry > 0 asks to look again after it.
func (c *Controller) decideInQueue(ctx context.Context, in *input) (d *decision, w *waitReason, retry time.Duration) {
	leftQuotaQueue := false
	c.model.Update(func(tx *model.Tx) { d, w, retry, leftQuotaQueue = c.decideInTx(ctx, tx, in) })
	// After the transaction: the namespace's share and its queue have locks of their own.
	c.shares.Charge(in.claim.Namespace, decisionFloor+in.checks, c.now())
	if leftQuotaQueue {
		c.requeueNamespace(in.claim.Namespace, claimKey(in.claim))
	}
	return d, w, retry
}

// decideInTx is decideInQueue inside its transaction; leftQuotaQueue says the claim no
// longer holds its namespace's quota queue.
func (c *Controller) decideInTx(ctx context.Context, tx *model.Tx, in *input) (d *decision, w *waitReason, retry time.Duration, leftQuotaQueue bool) {
	claim, key := in.claim, claimKey(in.claim)
	if tx.DecidedUnseen(key, c.now()) {
		// Our own allocation, not shown by the informer yet: never decide twice.
		c.pending.Decided(key)
		return nil, nil, 100 * time.Millisecond, false
	}
	if first, ok := c.pending.MoreCriticalFirst(key, in.pol.Quota.Binds(), c.now()); ok {
		// Capacity changed (a fault displaced pods, a claim went): a more critical claim
		// gets the first look at it.
		klog.FromContext(ctx).V(4).Info("Claim lets a more critical claim go first", "first", first)
		return nil, nil, 50 * time.Millisecond, false
	}
	if in.pol.Quota.Binds() {
		if c.pending.AnyUndecided(c.olderUnallocated(claim), c.now()) {
			// With workers in parallel a younger claim can get here first: let the older
			// one be looked at, or the younger could take quota it needs.
			return nil, nil, 50 * time.Millisecond, false
		}
		if ahead, ok := c.pending.QuotaAhead(claim.Namespace, key, claim.CreationTimestamp.Time); ok {
			// In the queue too: when the head goes, it is still ahead of younger claims.
			w = &waitReason{reason: ReasonQuotaQueued, quota: true, message: fmt.Sprintf("queued behind claim %s, which waits for quota in namespace %s (claims are placed in creation order)", ahead, claim.Namespace)}
		}
	}
	if w == nil {
		d, w = c.decider.decide(ctx, tx, in)
		if w != nil {
			w.reclaim = c.reclaim.plan(ctx, tx, in, c.decider, w)
		}
	}
	c.pending.Decided(key)
	// Placed, or waiting for something else than quota: claims queued behind it go on.
	leftQuotaQueue = c.pending.WaitForQuota(key, claim.CreationTimestamp.Time, w != nil && w.quota)
	if w == nil {
		c.ledger.Assume(in.pods, d.node, c.now())
	}
	return d, w, 0, leftQuotaQueue
}

// olderUnallocated lists the claims of the namespace that are fgpu's, unallocated, not being
// deleted, and older than claim.
func (c *Controller) olderUnallocated(claim *resourceapi.ResourceClaim) []string {
	list, err := c.claims.ResourceClaims(claim.Namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	var out []string
	for _, o := range list {
		if o.UID == claim.UID || o.Status.Allocation != nil || o.DeletionTimestamp != nil || !c.cfg.isOurs(o) {
			continue
		}
		if o.CreationTimestamp.Before(&claim.CreationTimestamp) ||
			(o.CreationTimestamp.Equal(&claim.CreationTimestamp) && o.Name < claim.Name) {
			out = append(out, claimKey(o))
		}
	}
	return out
}

// commit writes a decision; if the write fails, its shares and assumed pods are released
// and the claim is retried.
func (c *Controller) commit(ctx context.Context, in *input, d *decision) (time.Duration, error) {
	claim, key := in.claim, claimKey(in.claim)
	msg := "Allocated: " + describe(d)
	d.reservedFor = in.reservedFor
	if err := c.write(ctx, claim, d, msg); err != nil {
		c.model.Release(key)
		c.ledger.Drop(in.pods)
		c.kick()
		return 0, err
	}
	c.refused.Placed(claim.UID)
	c.pending.Forget(key)
	c.metrics.placedIn(claim.Namespace)
	c.metrics.latency.Observe(c.now().Sub(claim.CreationTimestamp.Time).Seconds())
	klog.FromContext(ctx).V(2).Info("Placed claim", "node", d.node, "summary", msg)
	written := claim.DeepCopy() // its status annotation went out with the finalizer
	if written.Annotations == nil {
		written.Annotations = map[string]string{}
	}
	written.Annotations[api.AnnotationStatus] = msg
	c.status.tell(ctx, written, in.consumers, msg, ReasonPlaced)
	for _, note := range d.sized {
		c.recorder.Event(claim, corev1.EventTypeNormal, ReasonSized, note)
	}
	for _, p := range in.consumers {
		if p.Spec.NodeName != "" && p.Spec.NodeName != d.node {
			c.recorder.Event(p, corev1.EventTypeWarning, ReasonPodBoundElsewhere, fmt.Sprintf(
				"claim %s is on node %s, where the pods it is reserved for are bound; this pod is bound to node %s and cannot use it", claim.Name, d.node, p.Spec.NodeName))
		}
	}
	if warn := notEnforcedMessage(d); warn != "" {
		// Told once per placement, on the claim and its pods: the tenant must not take the
		// cap for a guarantee.
		c.recorder.Event(written, corev1.EventTypeWarning, ReasonMemoryNotEnforced, warn)
		for _, p := range in.consumers {
			c.recorder.Event(p, corev1.EventTypeWarning, ReasonMemoryNotEnforced, fmt.Sprintf("claim %s: %s", claim.Name, warn))
		}
	}
	return c.cfg.BindTimeout, nil
}
