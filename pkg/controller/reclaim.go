package controller

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// Reclaiming takes back room held on loan (model.Loan): a GPU that only namespaces granted
// allowSharedGPU use keeps off every claim that does not share across namespaces, and where
// each of them holds more such room than its quota pays for, a claim of another namespace
// that waits, and would be placed on that GPU were their shares gone, gets it. The allocator
// marks the shares' claims (fgpu.dev/reclaimed, which admission lets only the allocator write
// and which stops new pods from reserving the claim), deletes the pods that use them, and
// keeps the GPU for the waiting claim while they end. A claim from a template goes with its
// pod; any other is deallocated once its last pod is gone (kube-controller-manager, or the
// allocator's orphan check), and is placed again under the usual rules, away from the GPU
// kept. As with kube-scheduler's preemption, PodDisruptionBudgets do not stop it: the tenant
// writes them, and would keep the room by writing one.
//
// What is taken back is bounded: only GPUs whose shares would fit beside their namespaces'
// others (model.Mover), so that shares move rather than end, cheapest first; nothing once a
// namespace's quota pays for its room (all but the roomiest GPU's, as held.go counts it), and
// a plan takes no GPU the quota would pay for without the others it takes. One reclamation is
// under way per waiting namespace, until its victims are off the GPU, so that its claims, each
// within its quota alone, do not take back more than one of them can use.

const (
	// reclaimKeep is how long GPUs being taken back are kept for the claim they are taken
	// back for, if it is not placed sooner, and how long a reclamation may take.
	reclaimKeep = 2 * time.Minute
	// reclaimFailedFor is how long a claim is not planned again on a GPU a reclamation for it
	// did not free within reclaimKeep.
	reclaimFailedFor = 10 * time.Minute
	// reclaimGrace caps a reclaimed pod's termination grace period: a tenant's long one
	// would keep the GPU as long.
	reclaimGrace int64 = 30
	// reclaimGPUs bounds the GPUs one plan decides the waiting claim on, so that a retry
	// holds the model's lock about as long as three decisions; the next plan looks on from
	// where this one stopped. The cheapest to take back (whose shares hold least) are tried
	// first: the one, then reclaimCheapest, then all.
	reclaimGPUs     = 64
	reclaimCheapest = 8
	// reclaimWork bounds the shares and GPUs a plan looks at to find GPUs whose shares would
	// move (model.Mover.Visited), so that a namespace of many tiny shares cannot make a plan
	// hold the model's lock long; the next plan looks on from where this one stopped.
	reclaimWork = 200_000
	// PodReasonPreemptionByFgpu is the reason of the DisruptionTarget condition on a pod the
	// allocator deleted to take back a GPU (kube-scheduler's is PreemptionByScheduler), which
	// a Job's pod failure policy tells from a failure.
	PodReasonPreemptionByFgpu = "PreemptionByFgpu"
)

// reclaimer plans reclamations in a waiting claim's transaction, carries them out after it,
// and keeps the GPUs for that claim. Its lock is a leaf: the decider asks it about a GPU
// inside a model transaction.
type reclaimer struct {
	listers
	client   kubernetes.Interface
	recorder record.EventRecorder
	metrics  *Metrics
	now      func() time.Time
	fenced   func() error
	requeue  func(key string, after time.Duration)

	mu sync.Mutex
	// kept maps each GPU being taken back to the claim it is kept for, until that claim is
	// placed or gone; taken maps it to the reclamation under way, until its victims are off
	// it; failed are, per waiting claim, GPUs a reclamation did not free in time.
	kept   map[model.GPUKey]keptGPU
	taken  map[model.GPUKey]takenGPU
	failed map[string]map[model.GPUKey]time.Time
	// next is where the next plan starts among the GPUs on loan, and memo the GPUs on
	// loan; only used inside a model transaction, whose lock they share.
	next int
	memo loanMemo
}

type keptGPU struct {
	claim string // key
	until time.Time
}

type takenGPU struct {
	claim, ns string // the waiting claim (key) and its namespace
	victims   []types.UID
	until     time.Time
}

func newReclaimer(l listers, client kubernetes.Interface, recorder record.EventRecorder, m *Metrics, now func() time.Time, fenced func() error,
	requeue func(string, time.Duration)) *reclaimer {
	return &reclaimer{listers: l, client: client, recorder: recorder, metrics: m, now: now, fenced: fenced, requeue: requeue,
		kept: map[model.GPUKey]keptGPU{}, taken: map[model.GPUKey]takenGPU{}, failed: map[string]map[model.GPUKey]time.Time{}}
}

// reclamation is what a waiting claim takes back: GPUs, and the shares on them.
type reclamation struct {
	gpus    []model.GPUKey
	victims []victim
}

// victim is a share taken back: its claim and the GPU it is on.
type victim struct {
	claim string // key
	uid   types.UID
	on    model.GPUKey
}

// whatIf narrows a decision to the GPUs a reclamation would free.
type whatIf struct{ only map[*model.GPU]bool }

// keptForOthers are the GPUs kept for claims other than claim (key): a decision's filter
// takes them once, not per GPU.
func (r *reclaimer) keptForOthers(claim string) map[model.GPUKey]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out map[model.GPUKey]bool
	now := r.now()
	for k, kg := range r.kept {
		if now.After(kg.until) || kg.claim == claim {
			continue
		}
		if out == nil {
			out = map[model.GPUKey]bool{}
		}
		out[k] = true
	}
	return out
}

// taking returns the GPUs a plan must leave aside (being taken back, or kept for a claim),
// those claim (key) must not be planned on again (a reclamation for it that did not free
// them in time), and whether a claim of namespace ns has a reclamation under way. A
// reclamation ends when its victims are off the GPU, or after reclaimKeep: it is not ended
// by its claim's going, so that a namespace cannot start another by deleting the pod that
// waited. Called inside a model transaction.
func (r *reclaimer) taking(tx *model.Tx, ns, claim string) (aside, failed map[model.GPUKey]bool, busy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	aside, failed = map[model.GPUKey]bool{}, map[model.GPUKey]bool{}
	for k, tg := range r.taken {
		if !victimsOn(tx, k, tg.victims) {
			delete(r.taken, k)
			continue
		}
		if now.After(tg.until) {
			delete(r.taken, k)
			if r.failed[tg.claim] == nil {
				r.failed[tg.claim] = map[model.GPUKey]time.Time{}
			}
			r.failed[tg.claim][k] = now.Add(reclaimFailedFor)
			continue
		}
		aside[k] = true
		busy = busy || tg.ns == ns
	}
	for k, kg := range r.kept {
		if now.After(kg.until) {
			delete(r.kept, k)
			continue
		}
		aside[k] = true
	}
	for c, gpus := range r.failed {
		for k, until := range gpus {
			if now.After(until) {
				delete(gpus, k)
			} else if c == claim {
				failed[k] = true
			}
		}
		if len(gpus) == 0 {
			delete(r.failed, c)
		}
	}
	return aside, failed, busy
}

// victimsOn reports whether any of the claims is still on GPU k.
func victimsOn(tx *model.Tx, k model.GPUKey, victims []types.UID) bool {
	g, ok := tx.GPU(k)
	if !ok {
		return false
	}
	for t := range g.Tenants() {
		if slices.Contains(victims, t.Claim) {
			return true
		}
	}
	return false
}

// reclaiming reports whether a reclamation under way takes claim uid back.
func (r *reclaimer) reclaiming(uid types.UID) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for _, tg := range r.taken {
		if !now.After(tg.until) && slices.Contains(tg.victims, uid) {
			return true
		}
	}
	return false
}

// forget stops keeping GPUs for claim (key): it was placed, is gone, or waits for something
// else than room.
func (r *reclaimer) forget(claim string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, kg := range r.kept {
		if kg.claim == claim {
			delete(r.kept, k)
		}
	}
}

// heldOnLoan reports whether a namespace with quota q, using used, holds room on loan: its
// quota would not pay for charge, the room of its open GPUs (model.Loan) but its roomiest.
// Under heldRoom: Refuse (Kueue owns the quota) it may keep no such room at all.
func heldOnLoan(q policy.Quota, used, charge model.Usage) bool {
	if q.Invalid != nil {
		return false
	}
	if q.RefuseHeldRoom && (charge.Mem > 0 || charge.Comp > 0) {
		return true
	}
	return over(q, used, charge)
}

// loanedGPU is a GPU on loan, and the namespaces on it.
type loanedGPU struct {
	gpu *model.GPU
	ns  []string
}

// loanMemo is the GPUs on loan at one model generation, policies, GPUs kept and namespaces'
// labels (their versions): every waiting claim of a pass asks for them.
type loanMemo struct {
	gen    int
	sig    string
	nsRV   map[string]string
	gpus   []loanedGPU
	quotas map[string]policy.Quota
}

// loans lists the GPUs held on loan by namespaces other than ns, with their quotas, the GPUs
// in kept aside. It is memoised (loanMemo) and only used inside a model transaction, whose
// lock it shares.
func (r *reclaimer) loans(tx *model.Tx, ns string, kept map[model.GPUKey]bool) (gpus []loanedGPU, quotas map[string]policy.Quota) {
	policies := r.policyList()
	sig := make([]string, 0, len(policies)+len(kept))
	for _, p := range policies {
		sig = append(sig, p.Name+"@"+p.ResourceVersion)
	}
	for k := range kept {
		sig = append(sig, k.String())
	}
	slices.Sort(sig)
	key := strings.Join(sig, ",")
	m := &r.memo
	if m.gen != tx.Gen() || m.sig != key || !r.sameLabels(m.nsRV) {
		*m = loanMemo{gen: tx.Gen(), sig: key, nsRV: map[string]string{}, quotas: map[string]policy.Quota{}}
		onLoan := map[string][]*model.GPU{}
		for _, n := range tx.SpreadOpen() {
			nsObj, err := r.namespaces.Get(n)
			labels := map[string]string{}
			if err == nil {
				m.nsRV[n] = nsObj.ResourceVersion
				if nsObj.Labels != nil {
					labels = nsObj.Labels
				}
			} else {
				m.nsRV[n] = ""
			}
			q := policy.NamespaceQuota(policies, labels)
			if !q.Binds() && !q.RefuseHeldRoom {
				continue
			}
			loan := tx.Loan(n, func(g *model.GPU) bool { return kept[g.Key()] })
			if heldOnLoan(q, usedBy(tx, n), loan.Charge) {
				m.quotas[n] = q
				onLoan[n] = loan.Open
			}
		}
		// A GPU is taken back only where every namespace on it holds room on loan: one
		// whose quota pays for its room keeps it, and its co-tenants with it.
		seen := map[*model.GPU]bool{}
		for _, n := range slices.Sorted(maps.Keys(onLoan)) {
			for _, g := range onLoan[n] {
				if seen[g] {
					continue
				}
				seen[g] = true
				nss := g.Namespaces()
				if !slices.ContainsFunc(nss, func(o string) bool { _, ok := onLoan[o]; return !ok }) {
					m.gpus = append(m.gpus, loanedGPU{gpu: g, ns: nss})
				}
			}
		}
	}
	for _, lg := range m.gpus {
		if !slices.Contains(lg.ns, ns) {
			gpus = append(gpus, lg)
		}
	}
	return gpus, m.quotas
}

// sameLabels reports whether the namespaces' versions are still those given.
func (r *reclaimer) sameLabels(rv map[string]string) bool {
	for n, v := range rv {
		cur := ""
		if o, err := r.namespaces.Get(n); err == nil {
			cur = o.ResourceVersion
		}
		if cur != v {
			return false
		}
	}
	return true
}

// usedBy is what namespace ns's claims and its workloads scaled to zero take of its quota.
func usedBy(tx *model.Tx, ns string) model.Usage {
	c, res := tx.Charged(ns), tx.Reserve(ns)
	return model.Usage{Mem: addSat(c.Mem, res.Mem), Comp: addSat(c.Comp, res.Comp)}
}

// plan is called in the transaction that left in's claim waiting for room (w): it decides
// the claim again on GPUs held on loan (up to reclaimGPUs of them, the next ones at the next
// retry), with their shares taken out. Where it would be placed, the GPUs are kept for it
// from now on, and their shares are the victims. It is nil where the allocator is fenced,
// nothing is on loan, the claim waits for something else, or a claim of its namespace has a
// reclamation under way.
func (r *reclaimer) plan(ctx context.Context, tx *model.Tx, in *input, dc *decider, w *waitReason) *reclamation {
	if w.reason != ReasonWaiting || w.quota || w.beyondQuota || w.retryAfter > 0 || in.selectorsWait != nil || in.conflict != nil ||
		len(in.consumers) == 0 || r.fenced() != nil {
		return nil
	}
	key, ns := claimKey(in.claim), in.claim.Namespace
	aside, failed, busy := r.taking(tx, ns, key)
	if busy {
		return nil
	}
	all, quotas := r.loans(tx, ns, aside)
	all = slices.DeleteFunc(all, func(lg loanedGPU) bool { return failed[lg.gpu.Key()] })
	if len(all) == 0 {
		return nil
	}
	// A window of GPUs whose shares would move beside their namespace's others, the next
	// one at the next retry; cheapest to take back first.
	usable := r.usableNode()
	mv := tx.Mover(func(g *model.GPU) bool { return !aside[g.Key()] && usable(g) },
		func(n string) bool { return quotas[n].Compute != nil })
	start := r.next % len(all)
	var cands []*model.GPU
	tried := 0
	for ; tried < len(all) && tried < 4*reclaimGPUs && len(cands) < reclaimGPUs && mv.Visited < reclaimWork; tried++ {
		if g := all[(start+tried)%len(all)].gpu; mv.Movable(g) {
			cands = append(cands, g)
		}
	}
	r.next = start + tried
	in.checks += mv.Visited // the work, charged to the claim's namespace
	if len(cands) == 0 {
		return nil
	}
	// Cheapest first: the GPU whose shares hold least memory (no open GPU has a bursting share,
	// so that is what it uses).
	slices.SortStableFunc(cands, func(a, b *model.GPU) int { return cmp.Compare(a.UsedMem(), b.UsedMem()) })
	var d *decision
	for _, n := range []int{1, reclaimCheapest, len(cands)} {
		if d = r.whatIf(ctx, tx, in, dc, cands[:min(n, len(cands))]); d != nil || n >= len(cands) {
			break
		}
	}
	if d == nil {
		return nil
	}
	rec := &reclamation{}
	byNs := map[string][]*model.GPU{}
	victims := map[model.GPUKey][]types.UID{}
	for _, res := range d.results {
		g := res.gpu
		if slices.Contains(rec.gpus, g.Key()) {
			continue
		}
		rec.gpus = append(rec.gpus, g.Key())
		for t := range g.Tenants() {
			victims[g.Key()] = append(victims[g.Key()], t.Claim)
			rec.victims = append(rec.victims, victim{claim: t.Key, uid: t.Claim, on: g.Key()})
			if !slices.Contains(byNs[t.Namespace], g) {
				byNs[t.Namespace] = append(byNs[t.Namespace], g)
			}
		}
	}
	if len(rec.gpus) > 1 {
		picked := make([]*model.GPU, 0, len(rec.gpus))
		for _, k := range rec.gpus {
			g, _ := tx.GPU(k)
			picked = append(picked, g)
		}
		if !mv.Movable(picked...) {
			return nil // their shares would not fit beside their namespaces' others together
		}
	}
	// Each GPU taken must be one the namespace's quota does not pay for: with all it loses
	// but the one with least room taken out first, it still holds room on loan.
	for n, gs := range byNs {
		if len(gs) < 2 {
			continue
		}
		slices.SortFunc(gs, func(a, b *model.GPU) int { return compareRoom(b, a) })
		rest := map[*model.GPU]bool{}
		for _, g := range gs[:len(gs)-1] {
			rest[g] = true
		}
		loan := tx.Loan(n, func(g *model.GPU) bool { return aside[g.Key()] || rest[g] })
		if !heldOnLoan(quotas[n], usedBy(tx, n), loan.Charge) || !slices.Contains(loan.Open, gs[len(gs)-1]) {
			return nil
		}
	}
	// Kept in this transaction, so that the next one plans with them taken.
	until := r.now().Add(reclaimKeep)
	r.mu.Lock()
	for _, k := range rec.gpus {
		r.kept[k] = keptGPU{claim: key, until: until}
		r.taken[k] = takenGPU{claim: key, ns: ns, victims: victims[k], until: until}
	}
	r.mu.Unlock()
	return rec
}

// whatIf decides the waiting claim on the GPUs gs alone, with their shares taken out, and
// puts them back: where it would be placed were they gone, or nil.
func (r *reclaimer) whatIf(ctx context.Context, tx *model.Tx, in *input, dc *decider, gs []*model.GPU) *decision {
	only := map[*model.GPU]bool{}
	var keys []string
	for _, g := range gs {
		only[g] = true
		for t := range g.Tenants() {
			keys = append(keys, t.Key)
		}
	}
	in.checks += len(keys) // the what-if's work, charged to the claim's namespace
	var d *decision
	in.whatIf = &whatIf{only: only}
	gen := tx.Gen()
	tx.Without(keys, func() {
		if d, _ = dc.decide(ctx, tx, in); d != nil {
			tx.Remove(claimKey(in.claim))
		}
	})
	in.whatIf = nil
	if r.memo.gen == gen {
		r.memo.gen = tx.Gen() // the what-if left the model as it found it
	}
	return d
}

// usableNode says whether a GPU's node may take the pods of shares moved beside their
// namespace's others: it exists, is schedulable, and Kubernetes has not tainted it to keep
// new pods off (node.kubernetes.io/not-ready, unreachable, a pressure). Other taints the
// namespace's pods running there tolerate already.
func (r *reclaimer) usableNode() func(*model.GPU) bool {
	seen := map[string]bool{}
	return func(g *model.GPU) bool {
		name := g.Node()
		if ok, done := seen[name]; done {
			return ok
		}
		ok := false
		if n, err := r.nodes.Get(name); err == nil && !n.Spec.Unschedulable {
			ok = !slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool {
				return (t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute) && strings.HasPrefix(t.Key, "node.kubernetes.io/")
			})
		}
		seen[name] = ok
		return ok
	}
}

// compareRoom orders GPUs by free memory, then by name.
func compareRoom(a, b *model.GPU) int {
	return cmp.Or(cmp.Compare(a.Room().Mem, b.Room().Mem), strings.Compare(b.KeyText(), a.KeyText()))
}

// status is what a waiting claim's status adds to why it waits while GPUs are kept for it.
func (r *reclaimer) status(claim string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gpus []string
	now := r.now()
	for k, kg := range r.kept {
		if kg.claim == claim && !now.After(kg.until) {
			gpus = append(gpus, k.String())
		}
	}
	if len(gpus) == 0 {
		return ""
	}
	slices.Sort(gpus)
	return fmt.Sprintf("; taking back %s, held beyond what a quota pays for: the claim is placed there once the pods using it are gone",
		strings.Join(gpus, ", "))
}

// start marks rec's victims' claims and deletes the pods that use them (each claim is
// checked to be the one planned for).
func (r *reclaimer) start(ctx context.Context, rec *reclamation) {
	logger := klog.FromContext(ctx)
	logger.Info("Taking back GPUs held beyond a namespace's quota, for a claim that waits", "gpus", rec.gpus, "victims", len(rec.victims))
	for _, v := range rec.victims {
		ns, name, _ := strings.Cut(v.claim, "/")
		vc, err := r.claims.ResourceClaims(ns).Get(name)
		if err != nil || vc.UID != v.uid {
			continue // gone already
		}
		if err := r.mark(ctx, vc, v.on); err != nil {
			logger.Error(err, "Marking a claim taken back", "claim", klog.KObj(vc))
			continue
		}
		// Looked at again once the reclamation may have ended, to clear the mark if the
		// claim is still allocated (checkAllocated).
		r.requeue(v.claim, reclaimKeep+time.Second)
		why := fmt.Sprintf("namespace %s holds GPU %s and others that only namespaces granted allowSharedGPU use, more than its GPU quota pays for "+
			"(such GPUs are closed to claims that do not share GPUs); %s is taken back for a claim of another namespace that waits for it, "+
			"and the claim's shares fit beside the namespace's others", ns, v.on, v.on)
		for _, pod := range r.victimPods(vc) {
			if r.fenced() != nil {
				return
			}
			r.deletePod(ctx, pod, why)
		}
	}
}

// victimPods are the pods to delete so that claim is released: those that use it or reserve
// it, and that are neither done nor ending within reclaimGrace already. A pod the tenant
// deleted itself with a long grace period keeps running meanwhile: it is deleted again, which
// shortens the grace.
func (r *reclaimer) victimPods(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	pods := r.claimPods(claim)
	for _, ref := range claim.Status.ReservedFor {
		if ref.Resource != "pods" || ref.APIGroup != "" || slices.ContainsFunc(pods, func(p *corev1.Pod) bool { return p.UID == ref.UID }) {
			continue
		}
		if p, err := r.pods.Pods(claim.Namespace).Get(ref.Name); err == nil && p.UID == ref.UID {
			pods = append(pods, p)
		}
	}
	return slices.DeleteFunc(pods, func(p *corev1.Pod) bool {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			return true
		}
		g := p.DeletionGracePeriodSeconds
		return p.DeletionTimestamp != nil && g != nil && *g <= reclaimGrace
	})
}

// mark sets the claim's fgpu.dev/reclaimed to the GPU taken back, before its pods are
// deleted: admission then refuses new reservations of the claim, so that a controller's new
// pods do not keep it allocated there.
func (r *reclaimer) mark(ctx context.Context, claim *resourceapi.ResourceClaim, on model.GPUKey) error {
	if err := r.fenced(); err != nil {
		return err
	}
	if claim.Annotations[api.AnnotationReclaimed] == on.String() {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": claim.UID, "annotations": map[string]string{api.AnnotationReclaimed: on.String()}}})
	_, err := r.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// unmark removes fgpu.dev/reclaimed from a claim, so that pods may reserve it again: one no
// longer allocated, before it is placed again, or one whose reclamation ended without
// releasing it.
func (r *reclaimer) unmark(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	if _, ok := claim.Annotations[api.AnnotationReclaimed]; !ok {
		return nil
	}
	if r.fenced() != nil {
		return nil // the leader clears it
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": claim.UID, "annotations": map[string]any{api.AnnotationReclaimed: nil}}})
	_, err := r.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// deletePod marks pod as disrupted, as kube-scheduler's preemption does, and deletes it with
// at most reclaimGrace to end.
func (r *reclaimer) deletePod(ctx context.Context, pod *corev1.Pod, why string) {
	logger := klog.FromContext(ctx)
	cond := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: PodReasonPreemptionByFgpu,
		Message: "preempted by the fgpu allocator: " + why, LastTransitionTime: metav1.NewTime(r.now())}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if _, err := r.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		logger.V(2).Info("Could not mark a preempted pod", "pod", klog.KObj(pod), "err", err)
	}
	grace := reclaimGrace
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < grace {
		grace = *g
	}
	uid := pod.UID
	if r.fenced() != nil {
		return
	}
	err := r.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case err == nil:
		r.metrics.preempted.WithLabelValues(pod.Namespace).Inc()
		r.recorder.Event(pod, corev1.EventTypeWarning, ReasonPreempted, "preempted by the fgpu allocator: "+why)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
	default:
		logger.Error(err, "Preempting a pod", "pod", klog.KObj(pod))
	}
}
