package controller

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// The attacks of the review of reclaim.go, each as the tenant next door (or the honest
// namespace it might harm) would try it.

// reserve makes pod ns/n run on n1 and reserve its claim ns/n, as kube-scheduler and the
// kubelet would.
func reserve(t *testing.T, e *env, ns, n string, change func(*corev1.Pod)) {
	t.Helper()
	p, err := e.client.CoreV1().Pods(ns).Get(e.ctx, n, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := e.claim(ns, n).DeepCopy()
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: n, UID: p.UID}}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	p = p.DeepCopy()
	p.Spec.NodeName, p.Status.Phase = "n1", corev1.PodRunning
	if change != nil {
		change(p)
	}
	if _, err := e.client.CoreV1().Pods(ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
}

// endsSlowly is a pod its tenant deleted itself with a grace period of years (its containers
// ignore SIGTERM); the finalizer only keeps the fake API server from removing it.
func endsSlowly(p *corev1.Pod) {
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds, p.Finalizers = ptr.To(metav1.Now()), ptr.To[int64](1<<40), []string{"example.com/x"}
}

// podDeletes are the deletions of pods of namespace ns, with their grace periods.
func podDeletes(e *env, ns string) (graces []int64) {
	for _, a := range e.client.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && a.GetResource().Resource == "pods" && a.GetNamespace() == ns {
			g := int64(-1)
			if o := d.GetDeleteOptions(); o.GracePeriodSeconds != nil {
				g = *o.GracePeriodSeconds
			}
			graces = append(graces, g)
		}
	}
	return graces
}

// A tenant that deleted its pods itself with a grace period of years, so that they run on
// and keep their claims reserved, has them deleted again with reclaimGrace.
func TestPodsEndingSlowlyAreDeletedAgain(t *testing.T) {
	e := spreadEnv(t, "4Gi", 2, nil)
	reserve(t, e, "spread", "s0", endsSlowly)
	reserve(t, e, "spread", "s1", endsSlowly)
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	if graces := podDeletes(e, "spread"); len(graces) != 1 || graces[0] != reclaimGrace {
		t.Errorf("pod deletions with grace %v, want one with %d", graces, reclaimGrace)
	}
}

// A reclamation whose victims stay past reclaimKeep does not hold the waiting claim: its next
// plan takes another GPU on loan.
func TestAReclamationThatFreesNothingMovesOn(t *testing.T) {
	e := spreadEnv(t, "4Gi", 3, nil)
	for i := range 3 {
		reserve(t, e, "spread", fmt.Sprint("s", i), nil)
	}
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	first := takenBack(t, e, "team", "big")
	e.clock.Step(reclaimKeep + time.Second)
	e.run()
	if next := takenBack(t, e, "team", "big"); first == "" || next == "" || next == first {
		t.Errorf("taking back %q, then %q: want another GPU once the first was not freed in time", first, next)
	}
}

// Two namespaces granted allowSharedGPU (one team's two namespaces, say) that pin a share each
// to every GPU do not hide each other: a GPU only they use is on loan where both their quotas
// leave it so. A namespace whose quota pays for its room there keeps the GPU, and its
// co-tenants with it.
func TestSharedNamespacesDoNotHideEachOther(t *testing.T) {
	for name, quota2 := range map[string]string{"both on loan": "4Gi", "one pays": "400Gi"} {
		t.Run(name, func(t *testing.T) {
			objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
				namespaceObj("spread"), namespaceObj("spread2"), namespaceObj("team")}
			for i := range 4 {
				objs = append(objs, pinned("spread", fmt.Sprint("s", i), i, i)...)
				objs = append(objs, pinned("spread2", fmt.Sprint("s", i), i, 4+i)...)
			}
			pols := []*api.SharingPolicy{
				builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory("4Gi").Obj(),
				builders.MakePolicy("shared2").Namespaces("kubernetes.io/metadata.name", "spread2").AllowShared().QuotaMemory(quota2).Obj(),
			}
			e := newEnv(t, pols, objs...)
			e.run()
			e.create(builders.MakeClaim("team", "big").Created(20).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
			e.run()
			taken, deletes := takenBack(t, e, "team", "big"), len(podDeletes(e, "spread"))+len(podDeletes(e, "spread2"))
			if want := quota2 == "4Gi"; (taken != "") != want || (deletes == 2) != want || (deletes == 0) == want {
				t.Errorf("taking back %q, %d pods deleted", taken, deletes)
			}
		})
	}
}

// A waiting namespace that deletes its waiting pod right after a plan, and makes another
// claim wait, does not start another reclamation while the first one's victims are still on
// their GPU: under an 82Gi quota the spread namespace owes one GPU's room, and loses one.
func TestWaiterChurnTakesNoMoreThanTheLoan(t *testing.T) {
	e := spreadEnv(t, "82Gi", 3, nil)
	for i := range 3 {
		reserve(t, e, "spread", fmt.Sprint("s", i), nil)
	}
	for i := range 3 {
		n := fmt.Sprint("w", i)
		w := builders.MakeClaim("team", n).Memory("40Gi").Created(10 + i).Obj()
		w.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, i))
		e.create(w, builders.MakePod("team", n).Claim(n).Obj())
		e.run()
		if err := e.client.CoreV1().Pods("team").Delete(e.ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e.run()
	}
	if n := len(podDeletes(e, "spread")); n != 1 {
		t.Errorf("%d of the spread namespace's pods deleted, want 1", n)
	}
}

// An honest namespace granted allowSharedGPU, placed beside another shared namespace that then
// left, is the only one on two GPUs, beyond what its 100Gi quota pays for: a waiting claim
// takes one GPU back only where the shares there fit beside the namespace's others (40Gi
// beside 40Gi: one pod is deleted, its share moves); 45Gi shares, which would not, stay.
func TestANamespaceLeftAloneLosesOnlyWhatFitsBesideItsOthers(t *testing.T) {
	for size, want := range map[string]int{"40Gi": 1, "45Gi": 0} {
		t.Run(size, func(t *testing.T) {
			objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
				namespaceObj("honest"), namespaceObj("team")}
			for i := range 2 {
				n := fmt.Sprint("h", i)
				c := builders.MakeClaim("honest", n).Memory(size).Created(i).Obj()
				c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, i))
				objs = append(objs, c, builders.MakePod("honest", n).Claim(n).Obj())
			}
			pols := []*api.SharingPolicy{builders.MakePolicy("h").Namespaces("kubernetes.io/metadata.name", "honest").AllowShared().QuotaMemory("100Gi").Obj()}
			e := newEnv(t, pols, objs...)
			e.run()
			e.create(builders.MakeClaim("team", "w").Memory("30Gi").Created(20).Obj(), builders.MakePod("team", "w").Claim("w").Obj())
			e.run()
			if n := len(podDeletes(e, "honest")); n != want {
				t.Errorf("%d of its pods deleted, want %d (status of the waiting claim %q)", n, want, e.claim("team", "w").Annotations[api.AnnotationStatus])
			}
		})
	}
}

// Of the GPUs on loan a waiting claim fits, the one whose shares hold least is taken: the
// namespace's 1Gi share, not its 70Gi one.
func TestAPlanTakesTheCheapestGPU(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("spread"), namespaceObj("team")}
	big := builders.MakeClaim("spread", "big").Memory("70Gi").Created(0).Obj()
	big.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == 0`)
	objs = append(objs, big, builders.MakePod("spread", "big").Claim("big").Obj())
	objs = append(objs, pinned("spread", "small", 1, 1)...)
	pols := []*api.SharingPolicy{builders.MakePolicy("s").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory("75Gi").Obj()}
	e := newEnv(t, pols, objs...)
	e.run()
	e.create(builders.MakeClaim("team", "w").Memory("5Gi").Created(20).Obj(), builders.MakePod("team", "w").Claim("w").Obj())
	e.run()
	if podGone(e, "spread", "big") || !podGone(e, "spread", "small") {
		t.Errorf("taking back %q: the 70Gi share's pod gone %v, the 1Gi one's %v", takenBack(t, e, "team", "w"), podGone(e, "spread", "big"), podGone(e, "spread", "small"))
	}
}

// A reclamation abandoned half-way (its pod deletions failed, its waiting claim went) leaves
// no claim marked: once it has ended, the marked claims still allocated get the mark
// removed, so that a controller's new pods may reserve them again.
func TestAnAbandonedReclamationLeavesNoMark(t *testing.T) {
	e := spreadEnv(t, "4Gi", 2, nil)
	reserve(t, e, "spread", "s0", nil)
	reserve(t, e, "spread", "s1", nil)
	e.client.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetNamespace() == "spread" {
			return true, nil, fmt.Errorf("etcd timeout")
		}
		return false, nil, nil
	})
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	marked := ""
	for _, n := range []string{"s0", "s1"} {
		if _, ok := e.claim("spread", n).Annotations[api.AnnotationReclaimed]; ok {
			marked = n
		}
	}
	if marked == "" {
		t.Fatal("no claim marked")
	}
	_ = e.client.ResourceV1().ResourceClaims("team").Delete(e.ctx, "big", metav1.DeleteOptions{})
	_ = e.client.CoreV1().Pods("team").Delete(e.ctx, "big", metav1.DeleteOptions{})
	e.clock.Step(reclaimKeep + 2*time.Second)
	e.run()
	if m, ok := e.claim("spread", marked).Annotations[api.AnnotationReclaimed]; ok {
		t.Errorf("%s stays marked %q while allocated and reserved", marked, m)
	}
}

// spreadWith is namespace spread under policy pol, one claim (claim(i)) pinned to each of n1's
// GPUs, and namespaces team and other.
func spreadWith(t *testing.T, gpus int, pol *builders.PolicyBuilder, claim func(i int) *builders.ClaimBuilder) *env {
	t.Helper()
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", gpus, "80Gi"),
		namespaceObj("spread"), namespaceObj("team"), namespaceObj("other")}
	for i := range gpus {
		n := fmt.Sprint("s", i)
		c := claim(i).Created(i).Obj()
		c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, i))
		objs = append(objs, c, builders.MakePod("spread", n).Claim(n).Obj())
	}
	e := newEnv(t, []*api.SharingPolicy{pol.Obj()}, objs...)
	e.run()
	for i := range gpus {
		if got := e.placedOn("spread", fmt.Sprint("s", i)); got != fmt.Sprintf("n1/gpu-%d", i) {
			t.Fatalf("pinned share s%d on %q", i, got)
		}
	}
	return e
}

// What a namespace chose for its own shares does not keep them apart from being taken back:
// 1Gi shares asking 60% compute each under a memory-only quota. Compute its quota pays for
// does (60% shares under a 400% compute quota pay for most of each GPU).
func TestOwnChoicesDoNotMakeSharesUnmovable(t *testing.T) {
	shared := func() *builders.PolicyBuilder {
		return builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory("4Gi")
	}
	for name, tc := range map[string]struct {
		pol   *builders.PolicyBuilder
		claim func(int) *builders.ClaimBuilder
		taken bool
	}{
		"compute under a memory-only quota": {shared(), func(i int) *builders.ClaimBuilder {
			return builders.MakeClaim("spread", fmt.Sprint("s", i)).Memory("1Gi").Compute("60")
		}, true},
		"compute the quota pays for": {shared().QuotaCompute(400), func(i int) *builders.ClaimBuilder {
			return builders.MakeClaim("spread", fmt.Sprint("s", i)).Memory("1Gi").Compute("60")
		}, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := spreadWith(t, 4, tc.pol, tc.claim)
			e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(100).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
			e.run()
			if taken := takenBack(t, e, "team", "big"); (taken != "") != tc.taken {
				t.Errorf("taking back %q, want taken %v (status %q)", taken, tc.taken, e.claim("team", "big").Annotations[api.AnnotationStatus])
			}
		})
	}
}

// A GPU being taken back for one claim is no room for the shares of another: the 20Gi share
// on gpu-2 could only move to gpu-1, which is kept for team's claim, so other's claim takes
// nothing.
func TestAGPUBeingTakenIsNoRoomToMoveTo(t *testing.T) {
	e := spreadWith(t, 3, builders.MakePolicy("s").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory("100Gi"),
		func(i int) *builders.ClaimBuilder {
			return builders.MakeClaim("spread", fmt.Sprint("s", i)).Memory([]string{"70Gi", "1Gi", "20Gi"}[i])
		})
	for i, ns := range []string{"team", "other"} {
		w := builders.MakeClaim(ns, "w").Memory("40Gi").Created(20 + i).Obj()
		w.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, i+1))
		e.create(w, builders.MakePod(ns, "w").Claim("w").Obj())
		e.run()
	}
	if !podGone(e, "spread", "s1") || podGone(e, "spread", "s2") {
		t.Errorf("s1's pod gone %v (want true), s2's %v (want false)", podGone(e, "spread", "s1"), podGone(e, "spread", "s2"))
	}
}

// A GPU on a cordoned node is no room to move to: the shares would be placed nowhere.
func TestACordonedNodeIsNoRoomToMoveTo(t *testing.T) {
	for _, cordoned := range []bool{false, true} {
		t.Run(fmt.Sprint("cordoned ", cordoned), func(t *testing.T) {
			objs := []runtime.Object{builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
				namespaceObj("spread"), namespaceObj("team")}
			objs = append(objs, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj())
			for i, n := range []string{"n1", "n2"} {
				name := fmt.Sprint("s", i)
				c := builders.MakeClaim("spread", name).Memory("1Gi").Created(i).Obj()
				c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == 0`)
				objs = append(objs, c, builders.MakePod("spread", name).Claim(name).NodeSelector("kubernetes.io/hostname", n).Obj())
			}
			pols := []*api.SharingPolicy{builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory("4Gi").Obj()}
			e := newEnv(t, pols, objs...)
			e.run()
			if e.placedOn("spread", "s0") != "n1/gpu-0" || e.placedOn("spread", "s1") != "n2/gpu-0" {
				t.Fatalf("shares on %q and %q", e.placedOn("spread", "s0"), e.placedOn("spread", "s1"))
			}
			if cordoned {
				n2, err := e.client.CoreV1().Nodes().Get(e.ctx, "n2", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				n2 = n2.DeepCopy()
				n2.Spec.Unschedulable = true
				if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n2, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
					if n, err := e.c.nodes.Get("n2"); err == nil && n.Spec.Unschedulable {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("the node lister does not show n2 cordoned")
					}
				}
			}
			w := builders.MakePod("team", "w").Claim("w").Obj()
			w.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "n1"}
			e.create(builders.MakeClaim("team", "w").Memory("40Gi").Created(10).Obj(), w)
			e.run()
			if taken := takenBack(t, e, "team", "w") != ""; taken == cordoned {
				t.Errorf("taking back %v with n2 cordoned %v", taken, cordoned)
			}
		})
	}
}

// Critical shares are never taken back, nor counted on loan: the allocator itself spreads
// them onto the emptiest GPUs (placement.Spread), so a namespace granted the critical class
// and allowSharedGPU did not choose the room beside them, and a share taken back would be
// spread again (a review found an honest namespace losing a pod each time another
// namespace's claim came and went). Its quota is charged as before (held.go).
func TestCriticalSharesAreNeverTakenBack(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), namespaceObj("crit"), namespaceObj("team")}
	for i := range 2 {
		n := fmt.Sprint("c", i)
		objs = append(objs, builders.MakeClaim("crit", n).Memory("4Gi").Created(i).Obj(), builders.MakePod("crit", n).Claim(n).Obj())
	}
	pols := []*api.SharingPolicy{builders.MakePolicy("crit").Namespaces("kubernetes.io/metadata.name", "crit").AllowShared().
		Latency(api.LatencyCritical).MaxCo(1).QuotaMemory("20Gi").Obj()}
	e := newEnv(t, pols, objs...)
	e.run()
	c0, c1 := e.placedOn("crit", "c0"), e.placedOn("crit", "c1")
	if c0 == "" || c1 == "" || c0 == c1 {
		t.Fatalf("critical shares on %q and %q, want two GPUs", c0, c1)
	}
	w := builders.MakeClaim("team", "w").Memory("60Gi").Created(10).Obj()
	w.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %s`, c1[len(c1)-1:]))
	e.create(w, builders.MakePod("team", "w").Claim("w").Obj())
	e.run()
	if taken, n := takenBack(t, e, "team", "w"), len(podDeletes(e, "crit")); taken != "" || n != 0 {
		t.Errorf("taking back %q, %d critical pods deleted", taken, n)
	}
	e.c.model.Update(func(tx *model.Tx) {
		if l := tx.Loan("crit", func(*model.GPU) bool { return false }); len(l.Open) != 0 {
			t.Errorf("critical shares' GPUs on loan: %v", l.Open)
		}
	})
}
