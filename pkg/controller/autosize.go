package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// Sizing Auto: a running pod whose measured use nears its memory cap, or stayed far below
// it for the shrink window, is evicted so that its controller recreates it, and Initial
// places the new pod's claim at the new size. MPS fixes a process's caps when it starts: a
// new pod is the only resize there is.
// When a pod is to be recreated is pkg/sizing/engine's Resizer's; this file queues and paces
// the evictions and tells them.
const (
	// autoEvictInterval: at most one eviction this often across the cluster; an eviction the
	// API server refused or that failed does not count.
	autoEvictInterval = 10 * time.Second
	// autoRetryAfter: an eviction the API server refused (a PodDisruptionBudget) is tried
	// again after this.
	autoRetryAfter = time.Minute
)

// resizeWant is a pod Auto wants recreated.
type resizeWant struct {
	pod   types.NamespacedName
	uid   types.UID
	w     api.SizingWorkload
	claim string // the pod's own claim
	share string
	// grow: recreated larger, to at least the workload's floor; move: moved off GPU move,
	// whose tenants together near its memory; else smaller, while the share's reports stay
	// far below capBytes.
	grow bool
	move model.GPUKey
	// drain: moved off GPU move, which consolidation empties (it ends the want with the drain).
	drain bool
	// toBurst: recreated to burst, its pod placed before its workload was measured.
	toBurst  bool
	capBytes int64
	why      string
	// since orders the wants, oldest first within a namespace; a refusal puts the pod last.
	since     time.Time
	notBefore time.Time
	// refusedTold: the pod was told once that a PodDisruptionBudget holds its eviction.
	refusedTold bool
}

// reason is why the pod is recreated, as fgpu_allocator_sizing_evictions_total counts it.
func (w *resizeWant) reason() string {
	switch {
	case w.grow:
		return "grow"
	case w.drain:
		return "consolidate"
	case w.move != (model.GPUKey{}):
		return "relieve"
	case w.toBurst:
		return "burst"
	default:
		return "shrink"
	}
}

type autoEvicted struct {
	pod types.NamespacedName
	uid types.UID
	at  time.Time
	// owner is the evicted pod's controller, and before the pods it had then: a pod of it
	// not among them is the evicted pod's replacement.
	owner  types.UID
	before map[types.UID]bool
}

// autoState is Auto's memory, under the sizer's lock.
type autoState struct {
	resizer *engine.Resizer
	wants   map[types.UID]*resizeWant
	last    map[api.SizingWorkload]autoEvicted
	// toldAtRequest: shares told that their use nears a cap that is all their claim asks.
	toldAtRequest map[string]bool
	lastEviction  time.Time
	// lastNamespace is where the last eviction was tried: namespaces take turns, so that one
	// namespace's refused evictions never hold another's.
	lastNamespace string
}

func newAutoState(headroom float64, shrinkAfter time.Duration) *autoState {
	return &autoState{resizer: engine.NewResizer(headroom, shrinkAfter), wants: map[types.UID]*resizeWant{}, last: map[api.SizingWorkload]autoEvicted{},
		toldAtRequest: map[string]bool{}}
}

// autoReport is one usage summary of a share under sizing Auto, for considerResize.
type autoReport struct {
	w      api.SizingWorkload
	share  string
	result resourceapi.DeviceRequestAllocationResult
	u      api.ShareUsage
	// burstable: the claim's policy lets its shares burst (best-effort, no shared GPU).
	burstable bool
}

// considerResize decides, from a share's new usage summary, whether its pod should be
// recreated larger or smaller. Only a pod whose claim is its own (from a template: it goes
// with the pod) and whose controller recreates it (a ReplicaSet or StatefulSet) is: a
// standalone claim would come back with the same allocation, a bare pod not at all, and a
// Job's pod would lose its work.
func (s *sizingLoop) considerResize(claim *resourceapi.ResourceClaim, pod *corev1.Pod, r autoReport) {
	own := metav1.GetControllerOf(claim)
	ctl := metav1.GetControllerOf(pod)
	if own == nil || own.Kind != "Pod" || own.UID != pod.UID || ctl == nil || (ctl.Kind != "ReplicaSet" && ctl.Kind != "StatefulSet") {
		return
	}
	q, ok := r.result.ConsumedCapacity[api.CapacityMemory]
	if !ok || q.Value() <= 0 {
		return
	}
	capBytes := q.Value()
	// A bursting share's cap is its placement's, above what it consumes; it is sized from
	// its workload's whole history already, so it is never recreated smaller.
	bursting := false
	if pl := model.AllocationConfig(s.cfg.DriverName, claim.Status.Allocation.Devices.Config, r.result.Request).Placement; pl != nil && pl.MemoryLimit != nil {
		capBytes, bursting = pl.MemoryLimit.Value(), true
	}
	gpuMem := s.model.GPUMemory(model.GPUKey{Pool: r.result.Pool, Device: r.result.Device})
	asked := askedMemory(claim, r.result.Request)
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	a := s.sizer.auto
	rec, ready := s.sizer.rec.Recommend(r.w)
	in := engine.Report{Workload: r.w, Share: r.share, Usage: r.u, Cap: capBytes, Bursting: bursting, GPUMemory: gpuMem, Asked: asked}
	if r.burstable {
		in.MayBurst = func(rec api.SizingRecommendation) bool { return s.shouldBurst(claim, r, rec, capBytes, gpuMem) }
	}
	if asked == 0 && gpuMem > 0 && capBytes >= gpuMem {
		in.ComesBackWhole = func(rec api.SizingRecommendation) bool { return s.keepsWholeGPU(claim, pod, r.result.Request, rec) }
	}
	d := a.resizer.Decide(in, rec, ready)
	rec, peak := d.Rec, r.u.MemoryMaxBytes
	switch d.Resize {
	case engine.AtRequest:
		if !a.toldAtRequest[r.share] {
			a.toldAtRequest[r.share] = true
			s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonResizeAtRequest,
				"its GPU memory use (%s) nears its cap %s, which is all claim %s asks for request %q: sizing Auto never gives a claim more than it asks; ask for more memory",
				fmtBytes(peak), fmtBytes(capBytes), claim.Name, r.result.Request)
		}
	case engine.Grow:
		s.wantResize(a, claim, pod, r, capBytes, true, fmt.Sprintf("its GPU memory use reached %s of its %s cap (request %q); its controller recreates it with %s, at most what its claim asks",
			fmtBytes(peak), fmtBytes(capBytes), r.result.Request, fmtBytes(d.Want)))
	case engine.ToBurst:
		if _, queued := a.wants[pod.UID]; queued {
			return
		}
		s.wantResize(a, claim, pod, r, capBytes, false, fmt.Sprintf("its workload is measured and its pods may burst (request %q): its controller recreates it guaranteed %s and capped at %s, where its workload's use fits",
			r.result.Request, fmtBytes(max(sizing.MemoryStep, rec.TypicalBytes)), fmtBytes(engine.BurstCap(rec))))
		a.wants[pod.UID].toBurst = true
	case engine.Shrink:
		s.wantResize(a, claim, pod, r, capBytes, false, fmt.Sprintf("its GPU memory use stayed under %s of its %s cap (request %q) since %s; its controller recreates it with %s",
			fmtBytes(int64(engine.FarBelow*float64(capBytes))), fmtBytes(capBytes), r.result.Request, d.Since.UTC().Format(time.RFC3339), fmtBytes(rec.MemoryBytes)))
	}
}

func (s *sizingLoop) wantResize(a *autoState, claim *resourceapi.ResourceClaim, pod *corev1.Pod, r autoReport, capBytes int64, grow bool, why string) {
	if _, ok := a.wants[pod.UID]; ok {
		return
	}
	a.wants[pod.UID] = &resizeWant{pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, uid: pod.UID, w: r.w,
		claim: claim.Name, share: r.share, grow: grow, capBytes: capBytes, why: why, since: s.now()}
}

// stillWanted re-checks a queued want when its turn comes: the pod's claim is still under
// sizing Auto, and the reason holds (a larger pod: the workload's floor is above the cap; a
// smaller one: the share's reports are still far below it). Caller holds the sizer's lock.
func (s *sizingLoop) stillWanted(a *autoState, want *resizeWant, pod *corev1.Pod) bool {
	claim, err := s.claims.ResourceClaims(want.pod.Namespace).Get(want.claim)
	if err != nil || claim.Status.Allocation == nil || s.policyOf(claim.Namespace, pod).Sizing != api.SizingAuto {
		return false
	}
	if want.grow {
		return a.resizer.Floor(want.w) > want.capBytes
	}
	if want.toBurst {
		return s.policyOf(claim.Namespace, pod).Latency == api.LatencyBestEffort
	}
	if want.drain {
		return s.burst.IsDraining(want.move) // an eviction may have ended its drain
	}
	if want.move != (model.GPUKey{}) {
		return true // relieve drops a move once the GPU's reports show room again
	}
	return a.resizer.Low(want.share)
}

// keepsWholeGPU says whether a pod of the claim placed again, its workload measured as rec,
// keeps the whole GPU its request asks for, as resolveRequest decides: the workload is busy
// and neither the policy nor the claim chose the mode.
func (s *sizingLoop) keepsWholeGPU(claim *resourceapi.ResourceClaim, pod *corev1.Pod, request string, rec api.SizingRecommendation) bool {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if a.name != request {
				continue
			}
			class, err := s.classes.Get(a.class)
			if err != nil {
				return false
			}
			userCfg, err := api.MergeConfigs(s.cfg.DriverName, api.RequestConfigs(class.Spec.Config, claim.Spec.Devices.Config, a.name), a.name)
			if err != nil {
				return false
			}
			_, note := sharingMode(s.policyOf(claim.Namespace, pod), userCfg, rec, true)
			return note == busyNote
		}
	}
	return false
}

// askedMemory is the memory a claim's request asks (0: none, a whole GPU).
func askedMemory(claim *resourceapi.ResourceClaim, request string) int64 {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if a.name == request {
				if q, ok := a.capacity[api.CapacityMemory]; ok {
					return q.Value()
				}
				return 0
			}
		}
	}
	return 0
}

// evictForResize evicts at most one pod Auto wants recreated, its workload with no eviction
// in the last usage report interval, no evicted pod still there and no replacement not
// ready yet: one pod of a workload at a time. Namespaces take turns, and
// within one the oldest want goes first. A refusal (429: a PodDisruptionBudget allows no
// disruption now) or a failure does not use up the cluster's eviction: the next
// namespace's pod is tried, and the refused one waits autoRetryAfter, behind its
// namespace's other wants. At most one attempt per namespace per call bounds the writes.
func (s *sizingLoop) evictForResize(ctx context.Context) {
	if s.fenced() != nil {
		return
	}
	now := s.now()
	s.sizer.mu.Lock()
	if now.Sub(s.sizer.auto.lastEviction) < autoEvictInterval {
		s.sizer.mu.Unlock()
		return
	}
	picks := s.resizePicks(now)
	s.sizer.mu.Unlock()
	for _, pick := range picks {
		// A drain was planned up to a report interval ago: its pods must still fit elsewhere.
		if pick.drain {
			if _, ok := s.drainMoves(ctx, pick.move); !ok {
				s.endDrain(pick.move, time.Time{})
				continue
			}
		}
		if s.evictOne(ctx, pick, now) {
			return
		}
	}
}

// resizePicks is the oldest eligible want of each namespace, the namespaces in turn after
// the last one tried. Caller holds the sizer's lock.
func (s *sizingLoop) resizePicks(now time.Time) []*resizeWant {
	a := s.sizer.auto
	byNS := map[string]*resizeWant{}
	// Whether each workload waits on its last eviction, worked out once per workload: it
	// lists the namespace's pods.
	waiting := map[api.SizingWorkload]bool{}
	for uid, want := range a.wants {
		pod, err := s.pods.Pods(want.pod.Namespace).Get(want.pod.Name)
		if err != nil || pod.UID != uid || pod.DeletionTimestamp != nil || !s.stillWanted(a, want, pod) {
			delete(a.wants, uid)
			continue
		}
		if now.Before(want.notBefore) {
			continue
		}
		waits, seen := waiting[want.w]
		if !seen {
			waits = s.waitsOnLastEviction(a, want.w, now)
			waiting[want.w] = waits
		}
		if waits {
			continue
		}
		cur := byNS[want.pod.Namespace]
		if cur == nil || want.since.Before(cur.since) || (want.since.Equal(cur.since) && uid < cur.uid) {
			byNS[want.pod.Namespace] = want
		}
	}
	namespaces := slices.Sorted(maps.Keys(byNS))
	// Those after the last one tried first, then from the start.
	i, _ := slices.BinarySearch(namespaces, a.lastNamespace)
	if i < len(namespaces) && namespaces[i] == a.lastNamespace {
		i++
	}
	namespaces = append(namespaces[i:], namespaces[:i]...)
	picks := make([]*resizeWant, len(namespaces))
	for j, ns := range namespaces {
		picks[j] = byNS[ns]
	}
	return picks
}

// replacementWait bounds how long a workload's next eviction waits for the last one's
// replacement to become ready: one that never does (crash-looping, unschedulable) must not
// stop Auto for the workload.
const replacementWait = 10 * time.Minute

// waitsOnLastEviction says whether workload w's next pod must wait: a workload's pods are
// evicted one at a time, the next one report interval after the last at the soonest, once
// the last evicted pod is gone and its replacement is ready (or replacementWait passed).
func (s *sizingLoop) waitsOnLastEviction(a *autoState, w api.SizingWorkload, now time.Time) bool {
	last, ok := a.last[w]
	switch {
	case !ok:
		return false
	case now.Sub(last.at) < s.cfg.SizingReportInterval:
		return true
	}
	if p, err := s.pods.Pods(last.pod.Namespace).Get(last.pod.Name); err == nil && p.UID == last.uid {
		return true
	}
	return now.Sub(last.at) < replacementWait && s.replacementStarting(last)
}

// replacementStarting says whether a pod that the last evicted pod's controller made since
// is still starting: not ready, not finished, not being deleted.
func (s *sizingLoop) replacementStarting(last autoEvicted) bool {
	if last.owner == "" {
		return false
	}
	for _, p := range s.podsOf(last.pod.Namespace, last.owner) {
		finished := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		if !last.before[p.UID] && p.DeletionTimestamp == nil && !finished && !podReady(p) {
			return true
		}
	}
	return false
}

// podsOf are namespace ns's pods whose controller is owner.
func (s *sizingLoop) podsOf(ns string, owner types.UID) []*corev1.Pod {
	pods, err := s.pods.Pods(ns).List(labels.Everything())
	if err != nil {
		return nil
	}
	return slices.DeleteFunc(pods, func(p *corev1.Pod) bool {
		c := metav1.GetControllerOf(p)
		return c == nil || c.UID != owner
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// evictOne tries to evict a picked pod; it reports whether the pod was evicted.
func (s *sizingLoop) evictOne(ctx context.Context, pick *resizeWant, now time.Time) bool {
	pod, err := s.pods.Pods(pick.pod.Namespace).Get(pick.pod.Name)
	if err != nil {
		return false
	}
	s.sizer.mu.Lock()
	still := s.sizer.auto.wants[pick.uid] == pick // not dropped since it was picked (a drain that ended)
	s.sizer.mu.Unlock()
	if !still {
		return false
	}
	uid := pick.uid
	evicted := autoEvicted{pod: pick.pod, uid: uid, at: now, before: map[types.UID]bool{}}
	if ctl := metav1.GetControllerOf(pod); ctl != nil {
		evicted.owner = ctl.UID
		for _, p := range s.podsOf(pod.Namespace, ctl.UID) {
			evicted.before[p.UID] = true
		}
	}
	err = s.client.CoreV1().Pods(pick.pod.Namespace).EvictV1(ctx, &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Name: pick.pod.Name, Namespace: pick.pod.Namespace},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
	})
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	a := s.sizer.auto
	a.lastNamespace = pick.pod.Namespace
	switch {
	case err == nil:
		delete(a.wants, uid)
		a.lastEviction = now
		a.last[pick.w] = evicted
		s.metrics.evicted.WithLabelValues(pick.pod.Namespace, pick.reason()).Inc()
		s.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonResizeEvicted,
			"evicted by sizing Auto: %s. MPS fixes a process's memory cap when it starts, so a new pod is the only way to resize it", pick.why)
		return true
	case apierrors.IsTooManyRequests(err) && pick.drain && apierrors.HasStatusCause(err, policyv1.DisruptionBudgetCause):
		// Emptying a GPU is worth no wait: another GPU is emptied meanwhile, and this one is
		// left alone for a while.
		s.endDrainLocked(pick.move, now.Add(engine.DrainGiveUp))
		s.recorder.Eventf(pod, corev1.EventTypeNormal, ReasonResizeBlocked,
			"sizing Auto would recreate it (%s), but the eviction was refused: %v; GPU %s is not emptied, for %s", pick.why, err, pick.move, engine.DrainGiveUp)
	case apierrors.IsTooManyRequests(err):
		pick.notBefore, pick.since = now.Add(autoRetryAfter), now
		if !pick.refusedTold {
			pick.refusedTold = true
			s.recorder.Eventf(pod, corev1.EventTypeWarning, ReasonResizeBlocked,
				"sizing Auto would recreate it (%s), but the eviction was refused: %v; tried again every %s", pick.why, err, autoRetryAfter)
		}
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		delete(a.wants, uid)
	default:
		pick.notBefore, pick.since = now.Add(autoRetryAfter), now
		klog.FromContext(ctx).Error(err, "Evicting a pod to resize it", "pod", pick.pod)
	}
	return false
}
