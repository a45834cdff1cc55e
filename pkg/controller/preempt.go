package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/controller/claimqueue"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// Preemption takes back the room a namespace holds uncharged. A namespace granted
// allowSharedGPU (or isolation none) keeps off its GPUs every claim that does not share
// across namespaces (whole GPUs, exclusive and critical claims, and those of every namespace
// under the default isolation), yet its quota pays only what its shares ask, since any
// namespace granted the same may still join. Where its shares are on more such GPUs than
// they need packed (model.Spread), a claim of another namespace that waits, and would be
// placed on one of those GPUs were its shares gone, gets it: the allocator deletes the pods
// that use the shares there and keeps the GPU for the waiting claim while they end.
//
// What it takes back is only room held for nothing (model.Preemptible): every share on the
// GPU must fit, under the co-tenancy rules, beside its own namespace's shares on another GPU,
// be of a latency class no higher than the waiting claim's, and be freed by deleting its pods
// (a claim from a template, or one whose pods no controller recreates; a standalone claim a
// Deployment's pods share is never freed that way). A recreated pod is placed again under
// the usual rules; one its selectors pin to the GPU taken back waits. As with kube-scheduler's
// preemption, PodDisruptionBudgets do not stop it: the tenant writes them, and would keep the
// room by writing one.

const (
	// nominationTTL is how long GPUs freed by preemption are kept for the claim they were
	// freed for, if it is not placed sooner.
	nominationTTL = 2 * time.Minute
	// preemptionGrace caps a preempted pod's termination grace period: a tenant's long one
	// would keep the GPU as long.
	preemptionGrace int64 = 30
	// planGPUs bounds the GPUs one plan tries to take back, so that a waiting claim's retry
	// holds the model's lock about as long as a decision, however many GPUs may be taken
	// back; the next plan looks on from where this one stopped.
	planGPUs = 64
	// PodReasonPreemptionByFgpu is the reason of the DisruptionTarget condition on a pod
	// the allocator preempted (kube-scheduler's is PreemptionByScheduler), which a Job's
	// pod failure policy tells from a failure.
	PodReasonPreemptionByFgpu = "PreemptionByFgpu"
)

// preemptor plans preemptions in a waiting claim's transaction, carries them out after it,
// and keeps the freed GPUs for that claim. Its lock is a leaf: the decider asks it about a
// GPU inside a model transaction.
type preemptor struct {
	listers
	client   kubernetes.Interface
	recorder record.EventRecorder
	metrics  *Metrics
	now      func() time.Time
	fenced   func() error

	mu sync.Mutex
	// freed maps each GPU being taken back to the claim it is kept for; into maps each GPU
	// its shares were found room on to the same claim. A plan takes neither while the
	// preemption stands; decisions of other claims keep off freed GPUs only.
	freed, into map[model.GPUKey]keptGPU
	// next is where the next plan starts among the GPUs that may be taken back; only used
	// inside a model transaction, whose lock it shares.
	next int
}

type keptGPU struct {
	claim string // key
	until time.Time
}

func newPreemptor(l listers, client kubernetes.Interface, recorder record.EventRecorder, m *Metrics, now func() time.Time, fenced func() error) *preemptor {
	return &preemptor{listers: l, client: client, recorder: recorder, metrics: m, now: now, fenced: fenced,
		freed: map[model.GPUKey]keptGPU{}, into: map[model.GPUKey]keptGPU{}}
}

// preemption is what a waiting claim takes back: GPUs, and the shares on them.
type preemption struct {
	gpus    []model.GPUKey
	victims []victim
}

// victim is a share taken back: its claim, the GPU it is on, and the GPU of its namespace it
// fits beside.
type victim struct {
	claim      string // key
	uid        types.UID
	on, beside model.GPUKey
}

// whatIf narrows a decision to the GPUs a plan would free.
type whatIf struct{ only map[*model.GPU]bool }

// keptForAnother reports whether GPU k is kept for a claim other than claim (key).
func (p *preemptor) keptForAnother(k model.GPUKey, claim string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kg, ok := p.freed[k]
	if ok && p.now().After(kg.until) {
		delete(p.freed, k)
		return false
	}
	return ok && kg.claim != claim
}

// planning returns the GPUs a plan must leave alone, and whether claim (key) has a
// preemption under way.
func (p *preemptor) planning(claim string) (avoid map[model.GPUKey]bool, mine bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	avoid = map[model.GPUKey]bool{}
	for _, m := range []map[model.GPUKey]keptGPU{p.freed, p.into} {
		for k, kg := range m {
			if now.After(kg.until) {
				delete(m, k)
				continue
			}
			avoid[k] = true
			mine = mine || kg.claim == claim
		}
	}
	return avoid, mine
}

// forget stops keeping GPUs for claim (key): it was placed, is gone, or waits for something
// else than room.
func (p *preemptor) forget(claim string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range []map[model.GPUKey]keptGPU{p.freed, p.into} {
		for k, kg := range m {
			if kg.claim == claim {
				delete(m, k)
			}
		}
	}
}

// movable reports whether deleting the pods of t's claim frees t: the claim is the one t was
// made for, not being deleted, and from a pod's template (it goes with its pod) or used by
// pods no controller recreates (kube-controller-manager deallocates it once they are gone).
func (p *preemptor) movable(t *model.Tenant) bool {
	claim, err := p.claims.ResourceClaims(t.Namespace).Get(strings.TrimPrefix(t.Key, t.Namespace+"/"))
	if err != nil || claim.UID != t.Claim || claim.DeletionTimestamp != nil {
		return false
	}
	if isPodOwned(claim) {
		return true
	}
	return !slices.ContainsFunc(p.consumers(claim), func(pod *corev1.Pod) bool { return metav1.GetControllerOf(pod) != nil })
}

// plan is called in the transaction that left in's claim waiting, turned away by another
// namespace's shares (w): it finds GPUs whose shares would fit beside their namespaces'
// other shares (up to planGPUs of them, the next ones at the next retry) and decides the
// claim again on those alone, with their shares taken out. Where it would be placed, the
// GPUs are kept for it from now on, and their shares are the victims. It is nil where the
// allocator is fenced, nothing may be taken back, or the claim's preemption is under way.
func (p *preemptor) plan(ctx context.Context, tx *model.Tx, in *input, dc *decider, w *waitReason) *preemption {
	if !w.keptOff || p.fenced() != nil {
		return nil
	}
	key := claimKey(in.claim)
	avoid, mine := p.planning(key)
	if mine {
		return nil
	}
	rank := claimqueue.ClassRank(in.pol.Latency)
	cands, next := tx.Preemptible(in.claim.Namespace, func(g *model.GPU) bool { return avoid[g.Key()] },
		func(t *model.Tenant) bool { return claimqueue.ClassRank(t.Latency) >= rank && p.movable(t) }, p.next, planGPUs)
	p.next = next
	if len(cands) == 0 {
		return nil
	}
	byGPU := map[*model.GPU]model.Preemptible{}
	var keys []string
	for _, c := range cands {
		byGPU[c.GPU] = c
		for t := range c.GPU.Tenants() {
			keys = append(keys, t.Key)
		}
	}
	in.checks += len(keys) // the what-if's work, charged to the claim's namespace
	only := map[*model.GPU]bool{}
	for g := range byGPU {
		only[g] = true
	}
	var d *decision
	in.whatIf = &whatIf{only: only}
	tx.Without(keys, func() {
		if d, _ = dc.decide(ctx, tx, in); d != nil {
			tx.Remove(key)
		}
	})
	in.whatIf = nil
	if d == nil {
		return nil
	}
	pre := &preemption{}
	freed := map[*model.GPU]bool{}
	for _, r := range d.results {
		if !freed[r.gpu] {
			freed[r.gpu] = true
			pre.gpus = append(pre.gpus, r.gpu.Key())
		}
	}
	into := map[model.GPUKey]bool{}
	for g := range freed {
		for t := range g.Tenants() {
			to := byGPU[g].Moves[t.ShareID]
			if into[to.Key()] || freed[to] {
				return nil // two GPUs' shares would need the same room, or room being freed
			}
			into[to.Key()] = true
			pre.victims = append(pre.victims, victim{claim: t.Key, uid: t.Claim, on: g.Key(), beside: to.Key()})
		}
	}
	// Kept in this transaction, so that the next one plans with them taken.
	until := p.now().Add(nominationTTL)
	p.mu.Lock()
	for _, k := range pre.gpus {
		p.freed[k] = keptGPU{claim: key, until: until}
	}
	for k := range into {
		p.into[k] = keptGPU{claim: key, until: until}
	}
	p.mu.Unlock()
	return pre
}

// status is what a waiting claim's status adds to why it waits while GPUs are kept for it.
func (p *preemptor) status(claim string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gpus []string
	now := p.now()
	for k, kg := range p.freed {
		if kg.claim == claim && !now.After(kg.until) {
			gpus = append(gpus, k.String())
		}
	}
	if len(gpus) == 0 {
		return ""
	}
	slices.Sort(gpus)
	return fmt.Sprintf("; taking back %s, held for nothing by another namespace granted allowSharedGPU (its shares there fit beside its others): the claim is placed there once the pods using it are gone",
		strings.Join(gpus, ", "))
}

// start deletes the pods that use pre's victims (their claims are checked to be the same).
func (p *preemptor) start(ctx context.Context, pre *preemption) {
	klog.FromContext(ctx).Info("Preempting shares that fit beside their namespaces' other shares, for a claim that waits", "gpus", pre.gpus, "victims", len(pre.victims))
	for _, v := range pre.victims {
		ns, name, _ := strings.Cut(v.claim, "/")
		vc, err := p.claims.ResourceClaims(ns).Get(name)
		if err != nil || vc.UID != v.uid {
			continue // gone already
		}
		why := fmt.Sprintf("its claim %s's share of GPU %s fits beside namespace %s's other shares on GPU %s; a namespace granted allowSharedGPU "+
			"is not charged for the room its shares keep from claims that do not share GPUs, so %s is taken back for a claim of another namespace that waits for it",
			name, v.on, ns, v.beside, v.on)
		for _, pod := range p.consumers(vc) {
			if p.fenced() != nil {
				return
			}
			p.preemptPod(ctx, pod, why)
		}
	}
}

// preemptPod marks pod as disrupted, as kube-scheduler's preemption does, and deletes it
// with at most preemptionGrace to end.
func (p *preemptor) preemptPod(ctx context.Context, pod *corev1.Pod, why string) {
	logger := klog.FromContext(ctx)
	cond := corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: PodReasonPreemptionByFgpu,
		Message: "preempted by the fgpu allocator: " + why, LastTransitionTime: metav1.NewTime(p.now())}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.PodCondition{cond}}})
	if _, err := p.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		logger.V(2).Info("Could not mark a preempted pod", "pod", klog.KObj(pod), "err", err)
	}
	grace := preemptionGrace
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < grace {
		grace = *g
	}
	uid := pod.UID
	if p.fenced() != nil {
		return
	}
	err := p.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &uid}})
	switch {
	case err == nil:
		p.metrics.preempted.WithLabelValues(pod.Namespace).Inc()
		p.recorder.Event(pod, corev1.EventTypeWarning, ReasonPreempted, "preempted by the fgpu allocator: "+why)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
	default:
		logger.Error(err, "Preempting a pod", "pod", klog.KObj(pod))
	}
}
