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
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// Preemption takes back the room a namespace holds uncharged. A namespace granted
// allowSharedGPU (or isolation none) keeps off its GPUs every claim that does not share
// across namespaces (whole GPUs, exclusive and critical claims, and those of every namespace
// under the default isolation), yet its quota pays only what its shares ask, since any
// namespace granted the same may still join. Where its shares are on more such GPUs than
// they need packed (model.Spread), a claim of another namespace that waits, and would be
// placed on one of those GPUs were its shares gone, gets it: the allocator deletes the pods
// that use the shares there and keeps the GPU for the waiting claim while they end. A pod a
// controller recreates is placed again under the usual rules, beside its namespace's other
// shares where they have room; one its selectors pin to the GPU waits.
//
// As with kube-scheduler's preemption, PodDisruptionBudgets do not stop it: the tenant
// writes them, and it would keep the room by writing one. What bounds it is the spread: a
// namespace loses at most the GPUs its shares do not need, whoever waits.

const (
	// nominationTTL is how long GPUs freed by preemption are kept for the claim they were
	// freed for, if it is not placed sooner.
	nominationTTL = 2 * time.Minute
	// preemptionGrace caps a preempted pod's termination grace period: a tenant's long one
	// would keep the GPU as long.
	preemptionGrace int64 = 30
	// planGPUs bounds the GPUs one plan tries to take back, so that a waiting claim's retry
	// holds the model's lock about as long as a decision, however many GPUs are spread over;
	// the next plan tries the next ones.
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
	// kept maps each GPU freed by preemption to the claim (key) it is kept for.
	kept map[model.GPUKey]keptGPU
	// next is where the next plan starts among the GPUs that may be taken back; only used
	// inside a model transaction, whose lock it shares.
	next int
}

type keptGPU struct {
	claim string
	until time.Time
}

func newPreemptor(l listers, client kubernetes.Interface, recorder record.EventRecorder, m *Metrics, now func() time.Time, fenced func() error) *preemptor {
	return &preemptor{listers: l, client: client, recorder: recorder, metrics: m, now: now, fenced: fenced, kept: map[model.GPUKey]keptGPU{}}
}

// preemption is what a waiting claim takes back: GPUs, with the claims on them, of spread
// namespaces.
type preemption struct {
	gpus    []model.GPUKey
	victims []string // claim keys
	spread  map[string]model.Spread
}

// keptForAnother reports whether GPU k is kept for a claim other than claim (key).
func (p *preemptor) keptForAnother(k model.GPUKey, claim string) bool {
	if p == nil {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	kg, ok := p.kept[k]
	if ok && p.now().After(kg.until) {
		delete(p.kept, k)
		return false
	}
	return ok && kg.claim != claim
}

// keptGPUs lists the GPUs kept for claims now; mine says whether claim (key) has some.
func (p *preemptor) keptGPUs(claim string) (gpus []model.GPUKey, mine bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for k, kg := range p.kept {
		if now.After(kg.until) {
			delete(p.kept, k)
			continue
		}
		gpus = append(gpus, k)
		mine = mine || kg.claim == claim
	}
	return gpus, mine
}

// forget stops keeping GPUs for claim (key): it was placed, or is gone.
func (p *preemptor) forget(claim string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, kg := range p.kept {
		if kg.claim == claim {
			delete(p.kept, k)
		}
	}
}

// plan is called in the transaction that left in's claim waiting for room: it finds the GPUs
// of spread namespaces that the claim would be placed on were their shares gone. It is nil
// where there are none, or where GPUs are kept for the claim already (its preemption is
// under way).
func (p *preemptor) plan(ctx context.Context, tx *model.Tx, in *input, dc *decider) *preemption {
	key := claimKey(in.claim)
	keptNow, mine := p.keptGPUs(key)
	if mine {
		return nil
	}
	// A GPU being taken back counts against its namespaces' spread while their shares are
	// still on it.
	taken := map[string]int{}
	for _, k := range keptNow {
		if g, ok := tx.GPU(k); ok {
			for _, ns := range gpuNamespaces(g) {
				taken[ns]++
			}
		}
	}
	cands := slices.DeleteFunc(tx.Preemptible(in.claim.Namespace, taken), func(g *model.GPU) bool { return slices.Contains(keptNow, g.Key()) })
	if len(cands) == 0 {
		return nil
	}
	if len(cands) > planGPUs {
		start := p.next % len(cands)
		p.next = start + planGPUs
		cands = append(cands[start:min(start+planGPUs, len(cands))], cands[:max(0, start+planGPUs-len(cands))]...)
	}
	var keys []string
	seen := map[string]bool{}
	for _, g := range cands {
		for t := range g.Tenants() {
			if !seen[t.Key] {
				seen[t.Key] = true
				keys = append(keys, t.Key)
			}
		}
	}
	in.checks += len(keys) // the what-if's work, charged to the claim's namespace
	// The namespaces' spread as it is, before the what-if moves the model on.
	spread := map[string]model.Spread{}
	for _, g := range cands {
		for _, ns := range gpuNamespaces(g) {
			spread[ns] = tx.Spread(ns)
		}
	}
	var d *decision
	tx.Without(keys, func() {
		if d, _ = dc.decide(ctx, tx, in); d != nil {
			tx.Remove(key)
		}
	})
	if d == nil {
		return nil
	}
	pre := &preemption{spread: map[string]model.Spread{}}
	from := map[string]int{}
	for _, r := range d.results {
		if !slices.Contains(cands, r.gpu) || slices.Contains(pre.gpus, r.gpu.Key()) {
			continue
		}
		pre.gpus = append(pre.gpus, r.gpu.Key())
		for t := range r.gpu.Tenants() {
			if !slices.Contains(pre.victims, t.Key) {
				pre.victims = append(pre.victims, t.Key)
			}
		}
		for _, ns := range gpuNamespaces(r.gpu) {
			from[ns]++
		}
	}
	if len(pre.gpus) == 0 {
		return nil // it fits without them now: decided again at once
	}
	for ns, n := range from {
		s := spread[ns]
		if s.Excess()-taken[ns] < n {
			return nil // more GPUs than the namespace holds beyond its need
		}
		pre.spread[ns] = s
	}
	slices.Sort(pre.victims)
	return pre
}

// gpuNamespaces lists the namespaces with a share of g.
func gpuNamespaces(g *model.GPU) []string {
	var out []string
	for t := range g.Tenants() {
		if !slices.Contains(out, t.Namespace) {
			out = append(out, t.Namespace)
		}
	}
	return out
}

// status is what a waiting claim's status adds to why it waits while GPUs are kept for it.
func (p *preemptor) status(claim string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gpus []string
	now := p.now()
	for k, kg := range p.kept {
		if kg.claim == claim && !now.After(kg.until) {
			gpus = append(gpus, k.String())
		}
	}
	if len(gpus) == 0 {
		return ""
	}
	slices.Sort(gpus)
	return fmt.Sprintf("; taking back %s, held beyond their need by namespaces whose quota does not pay for it: the claim is placed there once the pods using it are gone",
		strings.Join(gpus, ", "))
}

// start keeps pre's GPUs for claim and deletes the pods that use the claims on them.
func (p *preemptor) start(ctx context.Context, claim *resourceapi.ResourceClaim, pre *preemption) {
	if p.fenced() != nil {
		return
	}
	key, until := claimKey(claim), p.now().Add(nominationTTL)
	p.mu.Lock()
	for _, k := range pre.gpus {
		p.kept[k] = keptGPU{claim: key, until: until}
	}
	p.mu.Unlock()
	gpus := make([]string, len(pre.gpus))
	for i, k := range pre.gpus {
		gpus[i] = k.String()
	}
	on := strings.Join(gpus, ", ")
	klog.FromContext(ctx).Info("Preempting shares of namespaces spread over more GPUs than they need, for a claim that waits",
		"gpus", on, "victims", pre.victims, "spread", pre.spread)
	for _, vk := range pre.victims {
		ns, name, _ := strings.Cut(vk, "/")
		s := pre.spread[ns]
		why := fmt.Sprintf("namespace %s holds %d GPUs where its shares let in only namespaces granted allowSharedGPU, and its shares need %d of them; "+
			"that room is not charged to its quota, so GPU %s is taken back for a claim of another namespace that waits for it "+
			"(a new pod is placed beside the namespace's other shares where they have room)", ns, s.On, s.Need, on)
		vc, err := p.claims.ResourceClaims(ns).Get(name)
		if err != nil {
			continue // gone already
		}
		for _, pod := range p.consumers(vc) {
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
