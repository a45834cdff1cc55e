package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// pinned is a 1Gi claim of namespace ns that its selectors pin to GPU index, and its pod.
func pinned(ns, name string, index, created int) []runtime.Object {
	c := builders.MakeClaim(ns, name).Memory("1Gi").Created(created).Obj()
	c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, index))
	return []runtime.Object{c, builders.MakePod(ns, name).Claim(name).Obj()}
}

// spreadEnv is namespace spread, granted allowSharedGPU with quota, its 1Gi shares pinned one
// to each of n1's gpus GPUs, and the namespaces team and other under the default isolation.
func spreadEnv(t *testing.T, quota string, gpus int, pols []*api.SharingPolicy, more ...runtime.Object) *env {
	t.Helper()
	shared := builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared()
	switch quota {
	case "":
	case "refuse":
		// Kueue owns the quota: the namespace may keep room on one GPU only.
		shared = shared.RefuseHeldRoom()
	default:
		shared = shared.QuotaMemory(quota)
	}
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", gpus, "80Gi"),
		namespaceObj("spread"), namespaceObj("team"), namespaceObj("other")}
	for i := range gpus {
		objs = append(objs, pinned("spread", fmt.Sprint("s", i), i, i)...)
	}
	e := newEnv(t, append(pols, shared.Obj()), append(objs, more...)...)
	e.run()
	for i := range gpus {
		if got := e.placedOn("spread", fmt.Sprint("s", i)); got != fmt.Sprintf("n1/gpu-%d", i) {
			t.Fatalf("pinned share s%d on %q", i, got)
		}
	}
	return e
}

// takenBack is the GPU a waiting claim's status says is taken back for it ("" if none).
func takenBack(t *testing.T, e *env, ns, name string) string {
	t.Helper()
	st := e.claim(ns, name).Annotations[api.AnnotationStatus]
	_, after, ok := strings.Cut(st, "taking back ")
	if !ok {
		return ""
	}
	gpu, _, _ := strings.Cut(after, ",")
	return gpu
}

func podGone(e *env, ns, name string) bool {
	_, err := e.client.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
	return apierrors.IsNotFound(err)
}

// Issue #24, M4: a namespace granted allowSharedGPU that pins one small share to each GPU kept
// every claim that does not share across namespaces off them, and its quota paid only what
// the shares ask. Alone on two GPUs under a 4Gi quota, it holds one GPU's room its quota does
// not pay for: a waiting claim of a namespace under the default isolation takes that GPU
// back. The pod there is marked disrupted and deleted, its claim marked, the GPU is kept for
// the waiting claim (not for the tenant's pinned pod that comes back first), and the claim is
// placed there once the share is gone. The namespace keeps its roomiest GPU, which its quota
// need not pay for: another waiting claim takes nothing more.
func TestSpreadNamespaceGivesBackWhatItsQuotaDoesNotPay(t *testing.T) {
	e := spreadEnv(t, "4Gi", 2, nil)
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	if got := e.placedOn("team", "big"); got != "" {
		t.Fatalf("placed on %s beside another namespace's share without allowSharedGPU", got)
	}
	gpu := takenBack(t, e, "team", "big")
	taken, left := map[string][2]string{"n1/gpu-0": {"s0", "s1"}, "n1/gpu-1": {"s1", "s0"}}[gpu][0], map[string][2]string{"n1/gpu-0": {"s0", "s1"}, "n1/gpu-1": {"s1", "s0"}}[gpu][1]
	if taken == "" {
		t.Fatalf("status of the waiting claim %q does not say which GPU is taken back", e.claim("team", "big").Annotations[api.AnnotationStatus])
	}
	if !podGone(e, "spread", taken) {
		t.Errorf("pod %s on the GPU taken back is not deleted", taken)
	}
	if podGone(e, "spread", left) {
		t.Errorf("pod %s, on the GPU the namespace keeps, is gone", left)
	}
	if got := e.claim("spread", taken).Annotations[api.AnnotationReclaimed]; got != gpu {
		t.Errorf("claim %s marked %s=%q, want %q", taken, api.AnnotationReclaimed, got, gpu)
	}
	marked := false
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && p.GetName() == taken &&
			strings.Contains(string(p.GetPatch()), `"DisruptionTarget"`) && strings.Contains(string(p.GetPatch()), PodReasonPreemptionByFgpu) {
			marked = true
		}
	}
	if !marked {
		t.Error("the preempted pod was not marked DisruptionTarget before its deletion")
	}
	if ev := e.events(ReasonPreempted); len(ev) != 1 || !strings.Contains(ev[0], "more than its GPU quota pays for") || strings.Contains(ev[0], "team") {
		t.Errorf("events on the preempted pod: %q (want one that says why, without naming the waiting namespace)", ev)
	}
	if got := testutil.ToFloat64(e.c.metrics.preempted.WithLabelValues("spread")); got != 1 {
		t.Errorf("fgpu_allocator_preempted_pods_total{namespace=spread} = %v", got)
	}
	// The tenant's pod comes back first, pinned to the same GPU, with a claim older than the
	// waiting one; the GPU is kept for the claim it was taken back for.
	if err := e.client.ResourceV1().ResourceClaims("spread").Delete(e.ctx, taken, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(pinned("spread", taken+"-again", map[string]int{"s0": 0, "s1": 1}[taken], 5)...)
	e.run()
	if got := e.placedOn("team", "big"); got != gpu {
		t.Errorf("the waiting claim is on %q, want the GPU taken back for it (%s)", got, gpu)
	}
	if got := e.placedOn("spread", taken+"-again"); got != "" {
		t.Errorf("the tenant's recreated pinned claim took %s back", got)
	}
	// Alone on one GPU, the namespace holds nothing on loan: nothing more is taken.
	e.create(builders.MakeClaim("other", "big").Memory("40Gi").Created(20).Obj(), builders.MakePod("other", "big").Claim("big").Obj())
	e.run()
	if got, st := e.placedOn("other", "big"), takenBack(t, e, "other", "big"); got != "" || st != "" {
		t.Errorf("placed on %q, taking back %q", got, st)
	}
	if podGone(e, "spread", left) {
		t.Errorf("pod %s, on the one GPU its namespace keeps, is gone", left)
	}
	if ev := e.events(ReasonPreempted); len(ev) != 1 {
		t.Errorf("%d preemptions, want 1", len(ev))
	}
}

// Nothing is taken back from a namespace whose quota pays for the room it is alone on
// (200Gi, two GPUs), or that has no quota (its admin lets it hold any number of GPUs); nor
// for a claim over its own quota, or one whose pod fits no node the shares are on.
func TestNothingTakenBackThatIsPaidFor(t *testing.T) {
	for name, tc := range map[string]struct {
		quota  string
		waiter func() []runtime.Object
	}{
		"quota pays for both GPUs": {quota: "200Gi"},
		"no quota":                 {},
		"waiting claim over its own quota": {quota: "4Gi", waiter: func() []runtime.Object {
			return []runtime.Object{builders.MakeClaim("team", "w").Memory("100Gi").Created(10).Obj(), builders.MakePod("team", "w").Claim("w").Obj()}
		}},
		"waiting claim's pod fits another node only": {quota: "4Gi", waiter: func() []runtime.Object {
			return []runtime.Object{builders.MakeNode("n2").Obj(), builders.MakeClaim("team", "w").Memory("20Gi").Created(10).Obj(),
				builders.MakePod("team", "w").Claim("w").NodeSelector("kubernetes.io/hostname", "n2").Obj()}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			e := spreadEnv(t, tc.quota, 2, nil)
			w := []runtime.Object{builders.MakeClaim("team", "w").Memory("20Gi").Created(10).Obj(), builders.MakePod("team", "w").Claim("w").Obj()}
			if tc.waiter != nil {
				w = tc.waiter()
			}
			e.create(w...)
			e.run()
			if got, st := e.placedOn("team", "w"), takenBack(t, e, "team", "w"); got != "" || st != "" {
				t.Errorf("the waiting claim got %q, taking back %q", got, st)
			}
			if ev := e.events(ReasonPreempted); len(ev) != 0 {
				t.Errorf("preempted: %q", ev)
			}
		})
	}
}

// One namespace's waiting claims, each within its quota alone, take back one GPU at a time:
// five 40Gi claims (under a 40Gi quota, or none) delete the pods of one GPU, not of three.
// Another namespace's claim takes back another GPU, while the spread namespace still holds
// room on loan.
func TestOneReclaimPerWaitingNamespace(t *testing.T) {
	for _, quota := range []string{"", "40Gi"} {
		t.Run("team quota "+quota, func(t *testing.T) {
			var pols []*api.SharingPolicy
			if quota != "" {
				pols = append(pols, builders.MakePolicy("team").Namespaces("kubernetes.io/metadata.name", "team").QuotaMemory(quota).Obj())
			}
			e := spreadEnv(t, "4Gi", 4, pols)
			var objs []runtime.Object
			for i := range 5 {
				n := fmt.Sprint("w", i)
				objs = append(objs, builders.MakeClaim("team", n).Memory("40Gi").Created(10+i).Obj(), builders.MakePod("team", n).Claim(n).Obj())
			}
			e.create(objs...)
			e.run()
			gone := func() (n int) {
				for i := range 4 {
					if podGone(e, "spread", fmt.Sprint("s", i)) {
						n++
					}
				}
				return n
			}
			if n := gone(); n != 1 {
				t.Errorf("%d GPUs' pods deleted for one namespace's waiting claims, want 1", n)
			}
			e.create(builders.MakeClaim("other", "w").Memory("40Gi").Created(30).Obj(), builders.MakePod("other", "w").Claim("w").Obj())
			e.run()
			if n := gone(); n != 2 || takenBack(t, e, "other", "w") == "" {
				t.Errorf("%d GPUs' pods deleted for two namespaces, status of the second %q", n, e.claim("other", "w").Annotations[api.AnnotationStatus])
			}
		})
	}
}

// The shares a tenant arranges to look untakeable are taken all the same: a claim being
// deleted while its pod runs, and a standalone claim two pods of a controller share (both
// deleted; the claim is marked so that the controller's new pods cannot reserve it there).
// Once kube-controller-manager deallocates it, the allocator clears the mark before placing
// it again, and the GPU stays kept for the waiting claim. The namespace keeps one GPU (of
// equal rooms, the first by name).
func TestSharesArrangedToStayAreTakenBack(t *testing.T) {
	e := spreadEnv(t, "4Gi", 3, nil)
	// s1: being deleted, its pod still running (and reserving it).
	pod1, err := e.client.CoreV1().Pods("spread").Get(e.ctx, "s1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s1 := e.claim("spread", "s1").DeepCopy()
	s1.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "s1", UID: pod1.UID}}
	if s1, err = e.client.ResourceV1().ResourceClaims("spread").UpdateStatus(e.ctx, s1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
	s1.Finalizers = append(s1.Finalizers, "example.com/hold")
	s1.DeletionTimestamp = ptr.To(metav1.Now())
	if _, err := e.client.ResourceV1().ResourceClaims("spread").Update(e.ctx, s1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// s2: shared by two pods a ReplicaSet owns.
	rs := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: ptr.To(true)}
	p2 := builders.MakePod("spread", "s2-b").Claim("s2").Obj()
	var p1 *corev1.Pod
	p2.OwnerReferences = []metav1.OwnerReference{rs}
	p1, err = e.client.CoreV1().Pods("spread").Get(e.ctx, "s2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p1 = p1.DeepCopy()
	p1.OwnerReferences = []metav1.OwnerReference{rs}
	if _, err := e.client.CoreV1().Pods("spread").Update(e.ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Two waiting claims of two namespaces, each pinned to one of those GPUs.
	w1 := builders.MakeClaim("team", "w").Memory("40Gi").Created(10).Obj()
	w1.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == 1`)
	w2 := builders.MakeClaim("other", "w").Memory("40Gi").Created(11).Obj()
	w2.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == 2`)
	e.create(p2, w1, builders.MakePod("team", "w").Claim("w").Obj(), w2, builders.MakePod("other", "w").Claim("w").Obj())
	e.run()
	if takenBack(t, e, "team", "w") != "n1/gpu-1" || takenBack(t, e, "other", "w") != "n1/gpu-2" {
		t.Fatalf("taking back %q and %q, want n1/gpu-1 and n1/gpu-2; %q", takenBack(t, e, "team", "w"), takenBack(t, e, "other", "w"), e.claim("team", "w").Annotations[api.AnnotationStatus])
	}
	for _, p := range []string{"s1", "s2", "s2-b"} {
		if !podGone(e, "spread", p) {
			t.Errorf("pod %s not deleted", p)
		}
	}
	if podGone(e, "spread", "s0") {
		t.Error("the pod on the GPU the namespace keeps is gone")
	}
	// kube-controller-manager deallocates s2 once its pods are gone; the allocator clears the
	// mark before it places the claim again (pinned to the GPU kept, it waits).
	s2 := e.claim("spread", "s2").DeepCopy()
	if s2.Annotations[api.AnnotationReclaimed] != "n1/gpu-2" {
		t.Fatalf("s2 marked %q", s2.Annotations[api.AnnotationReclaimed])
	}
	s2.Status.Allocation, s2.Status.ReservedFor, s2.Status.Devices = nil, nil, nil
	if _, err := e.client.ResourceV1().ResourceClaims("spread").UpdateStatus(e.ctx, s2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.create(builders.MakePod("spread", "s2-c").Claim("s2").Obj())
	e.run()
	if _, ok := e.claim("spread", "s2").Annotations[api.AnnotationReclaimed]; ok {
		t.Error("the mark stays on a deallocated claim")
	}
	if got := e.placedOn("other", "w"); got != "n1/gpu-2" {
		t.Errorf("the waiting claim is on %q, want n1/gpu-2", got)
	}
	if got := e.placedOn("spread", "s2"); got != "" {
		t.Errorf("the tenant's claim went back to %s", got)
	}
}

// No plan while the allocator is fenced: another replica may lead.
func TestNoReclaimWhileFenced(t *testing.T) {
	e := spreadEnv(t, "4Gi", 2, nil)
	e.c.reclaim.fenced = func() error { return fmt.Errorf("fenced") }
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	if podGone(e, "spread", "s0") || podGone(e, "spread", "s1") {
		t.Error("pods deleted while fenced")
	}
	var deletes int
	for _, a := range e.client.Actions() {
		if a.GetVerb() == "delete" && a.GetResource().Resource == "pods" {
			deletes++
		}
	}
	if deletes != 0 {
		t.Errorf("%d pod deletions", deletes)
	}
}

// A claim of two whole GPUs takes back two GPUs only where the namespace's quota pays for
// neither: under 82Gi, a namespace of three 1Gi shares alone on three GPUs pays for one
// GPU's room beside its roomiest, so one GPU is on loan, not two, and the claim takes none.
func TestAPlanTakesNoMoreThanTheLoan(t *testing.T) {
	for quota, want := range map[string]int{"4Gi": 2, "82Gi": 0} {
		t.Run(quota, func(t *testing.T) {
			e := spreadEnv(t, quota, 3, nil)
			w := builders.MakeClaim("team", "w").Created(10).Obj()
			w.Spec.Devices.Requests[0].Exactly.Count = 2
			e.create(w, builders.MakePod("team", "w").Claim("w").Obj())
			e.run()
			gone := 0
			for i := range 3 {
				if podGone(e, "spread", fmt.Sprint("s", i)) {
					gone++
				}
			}
			if gone != want {
				t.Errorf("%d GPUs taken back, want %d (status %q)", gone, want, e.claim("team", "w").Annotations[api.AnnotationStatus])
			}
		})
	}
}

// Where Kueue owns a namespace's quota (heldRoom: Refuse, no limits of fgpu's), the namespace
// may keep room from others on one GPU only: a GPU beyond it is on loan.
func TestHeldRoomRefuseLendsEveryGPUButOne(t *testing.T) {
	e := spreadEnv(t, "refuse", 2, nil)
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	if takenBack(t, e, "team", "big") == "" || len(podDeletes(e, "spread")) != 1 {
		t.Errorf("taking back %q, %d pods deleted; want one GPU", takenBack(t, e, "team", "big"), len(podDeletes(e, "spread")))
	}
}

// A quota raised so that it pays for the namespace's room ends its loan at once, though the
// model did not change: the next waiting claim takes nothing. (A claim whose pod fits no node
// planned first, finding the loan and taking nothing.)
func TestARaisedQuotaEndsTheLoan(t *testing.T) {
	e := spreadEnv(t, "4Gi", 3, nil)
	e.create(builders.MakeClaim("team", "x").Memory("40Gi").Created(10).Obj(),
		builders.MakePod("team", "x").Claim("x").NodeSelector("kubernetes.io/hostname", "nowhere").Obj())
	e.run()
	p, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Get(e.ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p = p.DeepCopy()
	q := resource.MustParse("400Gi")
	p.Spec.Quota.Memory = &q
	p.ResourceVersion = "2" // as the API server moves it on; the fake client does not
	if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if p, err := e.c.policies.Get("shared"); err == nil && p.Spec.Quota.Memory.Cmp(q) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the policy lister does not show the raised quota")
		}
	}
	e.create(builders.MakeClaim("other", "w").Memory("40Gi").Created(20).Obj(), builders.MakePod("other", "w").Claim("w").Obj())
	e.run()
	if taken := takenBack(t, e, "other", "w"); taken != "" || len(podDeletes(e, "spread")) != 0 {
		t.Errorf("taking back %q after the quota was raised; %d pods deleted", taken, len(podDeletes(e, "spread")))
	}
}
