package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// autoEnv is a Deployment web's pods under sizing Auto, each with its own claim (from a
// template: the pod controls it) that asks asked and was placed at capGiB on one of n1's
// 80Gi GPUs; evictions go through a reactor that answers refuse (nil: allowed).
type autoEnv struct {
	*env
	evicted []string
	refuse  error
}

func (e *autoEnv) claimOf(pod, asked string, capGiB int64) (*resourceapi.ResourceClaim, *corev1.Pod) {
	p := ownedPod("team-a", pod, "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	p.OwnerReferences[0].UID = webReplicaSet
	b := builders.MakeClaim("team-a", pod+"-gpu")
	if asked != "" {
		b = b.Memory(asked)
	}
	claim := b.AllocatedOn("n1", "gpu-0").Obj()
	claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory] = *resource.NewQuantity(capGiB<<30, resource.BinarySI)
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
	return claim, p
}

func newAutoEnv(t *testing.T, objs ...runtime.Object) *autoEnv {
	objs = append(objs, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"))
	e := &autoEnv{env: newEnvWith(t, func(c *Config) {
		c.Sizing = sizing.DefaultOptions()
		c.Sizing.MinSamples = 90
	}, []*api.SharingPolicy{builders.MakePolicy("auto").Sizing(api.SizingAuto).Obj()}, objs...)}
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if e.refuse != nil {
			return true, nil, e.refuse
		}
		create, ok := a.(k8stesting.CreateAction)
		if !ok {
			return false, nil, nil
		}
		ev, ok := create.GetObject().(*policyv1.Eviction)
		if !ok {
			return false, nil, nil
		}
		e.evicted = append(e.evicted, ev.Name)
		return true, nil, nil
	})
	return e
}

// report writes summary i (5 min) of the claim's share, its peak at peakMiB.
func (e *autoEnv) report(claimName string, i int, peakMiB int64) {
	e.t.Helper()
	e.reportSM("team-a", claimName, i, peakMiB, 35)
}

// reportSM is report for a claim of namespace ns, with the share's SM activity at sm percent.
func (e *autoEnv) reportSM(ns, claimName string, i int, peakMiB int64, sm int) {
	e.t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cur := e.claim(ns, claimName)
	cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(e.t, cur, string(*cur.Status.Allocation.Devices.Results[0].ShareID), api.ShareUsage{
		From: t0.Add(time.Duration(i-1) * 5 * time.Minute), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
		MemoryMaxBytes: peakMiB << 20, SMSamples: 30, SMP95Percent: sm, SMMaxPercent: sm, SMMeanPercent: sm})}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.settle()
}

// A pod that Initial sized to 10Gi (its claim asks 40Gi) and whose use nears that cap is
// evicted, once, with an event that says why; its workload's next pods get at least its
// peak plus headroom.
func TestSizingAutoEvictsAPodNearItsCap(t *testing.T) {
	claim, pod := (&autoEnv{}).claimOf("web-7c9d5-a", "40Gi", 10)
	e := newAutoEnv(t, claim, pod)
	for i := 1; i <= 3; i++ {
		e.report(claim.Name, i, 7<<10)
	}
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 0 {
		t.Fatalf("evicted %v while use stayed at 70%% of the cap", e.evicted)
	}
	e.report(claim.Name, 4, 9900)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 || e.evicted[0] != pod.Name {
		t.Fatalf("evicted %v; want %s", e.evicted, pod.Name)
	}
	if ev := e.events(ReasonResizeEvicted); len(ev) != 1 || !strings.Contains(ev[0], "reached 9900Mi of its 10Gi cap") || !strings.Contains(ev[0], "MPS fixes") {
		t.Errorf("events %q", ev)
	}
	rec, ok := e.c.Recommendation(api.SizingWorkload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"})
	if !ok || float64(rec.MemoryBytes) < 9900*(1<<20)*1.15 {
		t.Errorf("recommendation %+v after the eviction; want at least the peak plus headroom", rec)
	}
	// The evicted pod is still there (terminating takes a while): no second eviction.
	e.clock.Step(time.Hour)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 {
		t.Errorf("evicted %v; want one eviction", e.evicted)
	}
}

// A workload's pods are evicted one at a time: the next one only once the last evicted pod
// is gone, its replacement is ready, and one usage report interval has passed since.
func TestSizingAutoEvictsOnePodOfAWorkloadAtATime(t *testing.T) {
	e, interval := newWebNearItsCaps(t)
	replace := func(name string, ready bool) *corev1.Pod {
		t.Helper()
		return e.replaceLastEvicted(name, func(p *corev1.Pod) { setReady(p, ready) })
	}
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 {
		t.Fatalf("evicted %v; want one pod of the workload", e.evicted)
	}
	replace("web-7c9d5-r1", true)
	e.clock.Step(interval - time.Second)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 {
		t.Fatalf("evicted %v within a report interval (%s) of the first eviction", e.evicted, interval)
	}
	e.clock.Step(time.Second)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 2 {
		t.Fatalf("evicted %v a report interval after the first, its replacement ready; want a second pod", e.evicted)
	}
	r2 := replace("web-7c9d5-r2", false)
	e.clock.Step(interval)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 2 {
		t.Fatalf("evicted %v while the last one's replacement is not ready", e.evicted)
	}
	setReady(r2, true)
	if _, err := e.client.CoreV1().Pods("team-a").UpdateStatus(e.ctx, r2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.cached(func() bool {
		p, err := e.c.pods.Pods("team-a").Get(r2.Name)
		return err == nil && podReady(p)
	})
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 3 || len(slices.Compact(slices.Sorted(slices.Values(e.evicted)))) != 3 {
		t.Errorf("evicted %v once the replacement was ready; want the workload's third pod", e.evicted)
	}
}

// newWebNearItsCaps is a Deployment's three pods, each measured near the cap of its 40Gi
// claim, so that Auto marks all three to grow; the usage report interval it returns is not
// the 5 minutes a fixed gap had, and above the cluster-wide pace of one eviction per
// autoEvictInterval.
func newWebNearItsCaps(t *testing.T) (*autoEnv, time.Duration) {
	t.Helper()
	var objs []runtime.Object
	var claims []string
	for _, name := range []string{"a", "b", "c"} {
		claim, pod := (&autoEnv{}).claimOf("web-7c9d5-"+name, "40Gi", 10)
		objs, claims = append(objs, claim, pod), append(claims, claim.Name)
	}
	e := newAutoEnv(t, objs...)
	interval := 30 * time.Second
	e.c.cfg.SizingReportInterval = interval
	for i := 1; i <= 4; i++ {
		peak := int64(7 << 10)
		if i == 4 {
			peak = 9900
		}
		for _, c := range claims {
			e.report(c, i, peak)
		}
	}
	return e, interval
}

// replaceLastEvicted deletes the last evicted pod and makes its replacement, a pod of the same
// ReplicaSet named name as set makes it.
func (e *autoEnv) replaceLastEvicted(name string, set func(*corev1.Pod)) *corev1.Pod {
	e.t.Helper()
	gone := e.evicted[len(e.evicted)-1]
	if err := e.client.CoreV1().Pods("team-a").Delete(e.ctx, gone, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	p := ownedPod("team-a", name, "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	p.OwnerReferences[0].UID = webReplicaSet
	set(p)
	if _, err := e.client.CoreV1().Pods("team-a").Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	// settle compares counts, which a delete and a create leave as they were.
	e.cached(func() bool {
		_, errGone := e.c.pods.Pods("team-a").Get(gone)
		_, errNew := e.c.pods.Pods("team-a").Get(name)
		return apierrors.IsNotFound(errGone) && errNew == nil
	})
	return p
}

// A replacement that will never be ready holds the workload's next eviction for a while
// only: a finished one (evicted by the kubelet, refused at admission) not at all, one that
// stays unready (crash-looping, unschedulable) for replacementWait.
func TestSizingAutoDoesNotWaitForeverOnAReplacement(t *testing.T) {
	e, interval := newWebNearItsCaps(t)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 {
		t.Fatalf("evicted %v; want one pod of the workload", e.evicted)
	}
	e.replaceLastEvicted("web-7c9d5-r1", func(p *corev1.Pod) { setReady(p, false); p.Status.Phase = corev1.PodFailed })
	e.clock.Step(interval)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 2 {
		t.Fatalf("evicted %v; want a second pod: the last one's replacement failed and will never be ready", e.evicted)
	}
	e.replaceLastEvicted("web-7c9d5-r2", func(p *corev1.Pod) { setReady(p, false); p.Status.Phase = corev1.PodPending })
	e.clock.Step(replacementWait - time.Second)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 2 {
		t.Fatalf("evicted %v while the last one's replacement is starting", e.evicted)
	}
	e.clock.Step(time.Second)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 3 || len(slices.Compact(slices.Sorted(slices.Values(e.evicted)))) != 3 {
		t.Errorf("evicted %v %s after the last eviction; want the workload's third pod", e.evicted, replacementWait)
	}
}

// cached waits for the controller's caches to hold what ok looks for.
func (e *autoEnv) cached(ok func() bool) {
	e.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if ok() {
			return
		}
	}
	e.t.Fatal("the controller's caches did not catch up")
}

// webReplicaSet is the UID of the ReplicaSet that controls autoEnv's pods.
const webReplicaSet = types.UID("rs-web-7c9d5")

func setReady(p *corev1.Pod, ready bool) {
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
}

// A PodDisruptionBudget that allows no disruption: the API server answers 429; the pod is
// told once, and the eviction is tried again after autoRetryAfter, not before.
func TestSizingAutoRetriesAnEvictionAPDBRefuses(t *testing.T) {
	claim, pod := (&autoEnv{}).claimOf("web-7c9d5-a", "40Gi", 10)
	e := newAutoEnv(t, claim, pod)
	e.refuse = apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
	attempts := 0
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" {
			attempts++
		}
		return false, nil, nil
	})
	for i := 1; i <= 3; i++ {
		e.report(claim.Name, i, 7<<10)
	}
	e.report(claim.Name, 4, 9900)
	e.c.sizing.evictForResize(e.ctx)
	e.clock.Step(autoEvictInterval)
	e.c.sizing.evictForResize(e.ctx)
	if attempts != 1 {
		t.Errorf("%d eviction attempts within %s of a refusal; want 1", attempts, autoRetryAfter)
	}
	if ev := e.events(ReasonResizeBlocked); len(ev) != 1 || !strings.Contains(ev[0], "disruption budget") {
		t.Errorf("events %q; want one saying the eviction was refused", ev)
	}
	e.refuse = nil
	e.clock.Step(autoRetryAfter)
	e.c.sizing.evictForResize(e.ctx)
	if attempts != 2 || len(e.evicted) != 1 {
		t.Errorf("%d attempts, evicted %v after the retry delay; want the second attempt to evict", attempts, e.evicted)
	}
	if ev := e.events(ReasonResizeBlocked); len(ev) != 1 {
		t.Errorf("told %d times of the refusal; want once", len(ev))
	}
}

// A pod whose use stayed far below its cap for the shrink window is evicted to come back
// at the recommendation; one of a standalone claim (not its pod's) is never, since it would
// come back with the same allocation; a pod whose use nears a cap that is all its claim
// asks is told to ask for more.
func TestSizingAutoShrinksAndTellsWhatItCannotDo(t *testing.T) {
	claim, pod := (&autoEnv{}).claimOf("web-7c9d5-a", "", 40)
	standalone, other := (&autoEnv{}).claimOf("web-7c9d5-b", "", 40)
	standalone.OwnerReferences = nil
	atReq, third := (&autoEnv{}).claimOf("web-7c9d5-c", "10Gi", 10)
	atReq.Status.Allocation.Devices.Results[0].Device = "gpu-1"
	e := newAutoEnv(t, claim, pod, standalone, other, atReq, third)
	for i := 1; i <= 11; i++ {
		e.report(claim.Name, i, 5<<10)
		e.report(standalone.Name, i, 5<<10)
		e.c.sizing.evictForResize(e.ctx)
		if len(e.evicted) != 0 {
			t.Fatalf("evicted %v after %d minutes of low use; want none before an hour", e.evicted, i*5)
		}
	}
	e.report(claim.Name, 13, 5<<10)
	e.report(standalone.Name, 13, 5<<10)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 || e.evicted[0] != pod.Name {
		t.Fatalf("evicted %v; want only %s (the standalone claim's pod would keep its size)", e.evicted, pod.Name)
	}
	if ev := e.events(ReasonResizeEvicted); len(ev) != 1 || !strings.Contains(ev[0], "stayed under") {
		t.Errorf("events %q", ev)
	}
	e.report(atReq.Name, 1, 9900)
	e.report(atReq.Name, 2, 9950)
	if ev := e.events(ReasonResizeAtRequest); len(ev) != 1 || !strings.Contains(ev[0], "ask for more memory") {
		t.Errorf("events %q; want one telling the pod to ask for more", ev)
	}
	e.clock.Step(time.Hour)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 {
		t.Errorf("evicted %v; a pod at its claim's request would come back the same", e.evicted)
	}
}

// A busy workload's pod on the whole GPU it asked for is not recreated smaller when its
// memory use stays far below the GPU: placed again it would keep the whole GPU, so the
// eviction would only restart it (once an hour, for ever). A workload that is not busy is.
func TestSizingAutoDoesNotShrinkWhatComesBackWhole(t *testing.T) {
	busy, busyPod := (&autoEnv{}).claimOf("web-7c9d5-a", "", 80)
	calm, calmPod := (&autoEnv{}).claimIn("team-b", "calm", "", 80)
	calm.Status.Allocation.Devices.Results[0].Device = "gpu-1"
	e := newAutoEnv(t, busy, busyPod, calm, calmPod)
	for i := 1; i <= 16; i++ {
		e.reportSM("team-a", busy.Name, i, 5<<10, 98)
		e.reportSM("team-b", calm.Name, i, 5<<10, 35)
		e.c.sizing.evictForResize(e.ctx)
	}
	if len(e.evicted) != 1 || e.evicted[0] != calmPod.Name {
		t.Fatalf("evicted %v; want only %s (the busy pod would come back on the whole GPU)", e.evicted, calmPod.Name)
	}
}

// Auto is Initial for new claims: a new pod of the workload is placed at the recommendation.
func TestSizingAutoSizesNewClaims(t *testing.T) {
	e := newSizingEnv(t, api.SizingAuto)
	for i := 1; i <= 3; i++ {
		e.report(i, 7, e.share)
	}
	rec, ok := e.c.Recommendation(e.w)
	if !ok {
		t.Fatal("no recommendation")
	}
	e.create(builders.MakeClaim("team-a", "c2").Memory("40Gi").Obj(), sizedPod("web-7c9d5-fghij", "c2"))
	e.run()
	if got := e.allocatedClaim("c2").Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]; got.Value() != rec.MemoryBytes {
		t.Errorf("new claim got %s; want the recommended %s", got.String(), fmtBytes(rec.MemoryBytes))
	}
}

// wantGrow queues the pod of claimOf(name) in namespace ns for a larger size, as a report
// near its cap does.
func (e *autoEnv) wantGrow(claim *resourceapi.ResourceClaim, pod *corev1.Pod) {
	w := api.SizingWorkload{Namespace: pod.Namespace, Kind: "Deployment", Name: "web", Request: "gpu"}
	e.c.sizing.sizer.mu.Lock()
	defer e.c.sizing.sizer.mu.Unlock()
	a := e.c.sizing.sizer.auto
	// A report at its 10Gi cap, with the workload recommended 20Gi: the floor is 20Gi.
	a.resizer.Decide(engine.Report{Workload: w, Share: "s-" + pod.Name, Usage: api.ShareUsage{MemoryMaxBytes: 10 << 30}, Cap: 10 << 30},
		api.SizingRecommendation{MemoryBytes: 20 << 30}, true)
	e.c.sizing.wantResize(a, claim, pod, autoReport{w: w, share: "s-" + pod.Name}, 10<<30, true, "near cap")
}

// claimIn is claimOf in namespace ns.
func (e *autoEnv) claimIn(ns, name, asked string, capGiB int64) (*resourceapi.ResourceClaim, *corev1.Pod) {
	claim, pod := e.claimOf(name, asked, capGiB)
	claim.Namespace, pod.Namespace = ns, ns
	pod.UID = types.UID(ns + "-" + pod.Name)
	claim.OwnerReferences[0].UID = pod.UID
	return claim, pod
}

// One namespace's evictions that a PodDisruptionBudget refuses take no turn from another
// namespace: its pod is evicted in the same pass, though team-a's wants are older and more.
func TestSizingAutoRefusedEvictionsDoNotStarveOtherNamespaces(t *testing.T) {
	var objs []runtime.Object
	type want struct {
		claim *resourceapi.ResourceClaim
		pod   *corev1.Pod
	}
	var wants []want
	for i := 0; i < 8; i++ {
		claim, pod := (&autoEnv{}).claimIn("team-a", fmt.Sprintf("web-7c9d5-%d", i), "40Gi", 10)
		objs = append(objs, claim, pod)
		wants = append(wants, want{claim, pod})
	}
	claim, pod := (&autoEnv{}).claimIn("team-b", "web-7c9d5-z", "40Gi", 10)
	objs = append(objs, claim, pod)
	wants = append(wants, want{claim, pod})
	e := newAutoEnv(t, objs...)
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" && a.GetNamespace() == "team-a" {
			return true, nil, apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
		}
		return false, nil, nil
	})
	for _, w := range wants {
		e.wantGrow(w.claim, w.pod)
		e.clock.Step(time.Second)
	}
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 1 || e.evicted[0] != "web-7c9d5-z" {
		t.Fatalf("evicted %v; want team-b's pod, whatever team-a's budget refuses", e.evicted)
	}
	if ev := e.events(ReasonResizeBlocked); len(ev) != 1 {
		t.Errorf("%d refusals told; want one (one attempt per namespace and pass)", len(ev))
	}
}

// A queued want is dropped when its turn comes if the reason is gone (a shrink whose
// share's use rose again) or the pod's policy is no longer sizing Auto.
func TestSizingAutoRechecksAQueuedWant(t *testing.T) {
	claim, pod := (&autoEnv{}).claimOf("web-7c9d5-a", "40Gi", 10)
	small, other := (&autoEnv{}).claimOf("web-7c9d5-b", "", 40)
	e := newAutoEnv(t, claim, pod, small, other)
	queued := func() int {
		e.c.sizing.sizer.mu.Lock()
		defer e.c.sizing.sizer.mu.Unlock()
		return len(e.c.sizing.sizer.auto.wants)
	}
	// Nothing keeps share "low" in lowSince: a report since was not far below its cap.
	e.c.sizing.sizer.mu.Lock()
	e.c.sizing.wantResize(e.c.sizing.sizer.auto, small, other, autoReport{w: api.SizingWorkload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"}, share: "low"},
		40<<30, false, "far below")
	e.c.sizing.sizer.mu.Unlock()
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 0 || queued() != 0 {
		t.Fatalf("evicted %v, %d queued, after the shrink's reason went; want none", e.evicted, queued())
	}
	e.wantGrow(claim, pod)
	pol := builders.MakePolicy("auto").Sizing(api.SizingOff).Obj()
	if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, pol, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if got, _ := e.c.policies.Get("auto"); got != nil && got.Spec.Sizing == api.SizingOff {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see the policy turn sizing Off")
		}
	}
	e.clock.Step(time.Hour)
	e.c.sizing.evictForResize(e.ctx)
	if len(e.evicted) != 0 || queued() != 0 {
		t.Fatalf("evicted %v, %d queued, after the policy turned sizing Off; want none", e.evicted, queued())
	}
}
