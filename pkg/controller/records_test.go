package controller

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	testingclock "k8s.io/utils/clock/testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/leader"
)

// restart is a fresh controller (an allocator restart) over what the API server holds now.
func (e *env) restart(policies []*api.SharingPolicy) *env {
	e.t.Helper()
	var objs []runtime.Object
	claims, _ := e.client.ResourceV1().ResourceClaims("").List(e.ctx, metav1.ListOptions{})
	for i := range claims.Items {
		claims.Items[i].ResourceVersion = ""
		objs = append(objs, &claims.Items[i])
	}
	pods, _ := e.client.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{})
	for i := range pods.Items {
		pods.Items[i].ResourceVersion = ""
		objs = append(objs, &pods.Items[i])
	}
	nodes, _ := e.client.CoreV1().Nodes().List(e.ctx, metav1.ListOptions{})
	for i := range nodes.Items {
		nodes.Items[i].ResourceVersion = ""
		objs = append(objs, &nodes.Items[i])
	}
	slices, _ := e.client.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{})
	for i := range slices.Items {
		slices.Items[i].ResourceVersion = ""
		objs = append(objs, &slices.Items[i])
	}
	n := newEnv(e.t, policies, objs...)
	n.clock.SetTime(e.clock.Now())
	return n
}

// tamper rewrites a claim's metadata as its tenant (edit in the namespace) can.
func (e *env) tamper(ns, name string, fn func(c *resourceapi.ResourceClaim)) {
	e.t.Helper()
	c := e.claim(ns, name)
	fn(c)
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Update(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// The co-tenancy rules a claim was placed under live in its allocation: a tenant that
// writes its own rules into the claim's metadata does not change them, after a restart
// either.
func TestRestartKeepsRulesFromAllocationNotMetadata(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c1").Memory("10Gi").Obj(), builders.MakePod("a", "p1").Claim("c1").Obj())
	e.run()
	if e.placedOn("a", "c1") != "n1/gpu-0" {
		t.Fatal("c1 not placed")
	}
	p := allocCfg(t, e.claim("a", "c1")).Placement
	if p == nil || p.LatencyClass != api.LatencyStandard || p.MaxTenantsPerGPU != 0 || p.Policy != "" {
		t.Fatalf("allocation's placement %+v", p)
	}
	// The tenant keeps the whole GPU to itself, as the former tenancy annotation allowed.
	e.tamper("a", "c1", func(c *resourceapi.ResourceClaim) {
		c.Annotations["fgpu.dev/tenancy"] = `{"latency":"standard","maxTenants":1}`
		c.Annotations["fgpu.dev/allocated-by"] = "fgpu-allocator"
	})
	e2 := e.restart(nil)
	e2.create(builders.MakeClaim("a", "c2").Memory("10Gi").Created(5).Obj(), builders.MakePod("a", "p2").Claim("c2").Obj())
	e2.run()
	if got := e2.placedOn("a", "c2"); got != "n1/gpu-0" {
		t.Fatalf("c2 placed on %q (%s): the tenant's annotation decided c1's rules", got, e2.claim("a", "c2").Annotations[api.AnnotationStatus])
	}
}

// A claim the allocator placed stays under its orphan and bind-timeout handling when its
// tenant removes the finalizer and annotations; the finalizer comes back.
func TestFinalizerRemovedStillTimesOutAndIsRestored(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	if first == "" {
		t.Fatal("not placed")
	}
	e.tamper("a", "c", func(c *resourceapi.ResourceClaim) {
		c.Annotations = nil
		c.Finalizers = []string{resourceapi.Finalizer}
	})
	e2 := e.restart(nil)
	e2.run()
	if !hasFinalizer(e2.claim("a", "c"), api.FinalizerAllocator) {
		t.Errorf("finalizer not restored: %v", e2.claim("a", "c").Finalizers)
	}
	if ev := e2.events(ReasonFinalizerRestored); len(ev) != 1 || !strings.Contains(ev[0], "added it back") {
		t.Errorf("finalizer events %v", ev)
	}
	e2.tamper("a", "c", func(c *resourceapi.ResourceClaim) { c.Finalizers = nil })
	e2.clock.Step(2 * time.Minute) // the pod never bound
	e2.run()
	if second := e2.placedOn("a", "c"); second == "" || second == first {
		t.Fatalf("after the bind timeout: first %q, now %q; want another node", first, second)
	}
}

func TestFinalizerRemovedOrphanStillReleased(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") == "" {
		t.Fatal("not placed")
	}
	e.tamper("a", "c", func(c *resourceapi.ResourceClaim) {
		c.Annotations = nil
		c.Finalizers = nil
	})
	_ = e.client.CoreV1().Pods("a").Delete(e.ctx, "p", metav1.DeleteOptions{})
	e2 := e.restart(nil)
	e2.clock.Step(time.Minute)
	e2.run()
	if e2.placedOn("a", "c") != "" {
		t.Fatal("allocation kept though no pod uses the claim")
	}
	if n := modelClaims(e2.c.model); n != 0 {
		t.Errorf("state still holds %d claims", n)
	}
}

// A tenant cannot forge the allocator's record through the claim configs it may write.
func TestClaimConfigWithPlacementRefused(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Config(map[string]any{"placement": map[string]any{"latencyClass": "critical", "maxCoTenants": 0}}).Obj(),
		builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "" {
		t.Fatal("a claim carrying its own placement was allocated")
	}
	const want = `request "gpu": placement is written by the fgpu allocator only`
	if st := e.claim("a", "c").Annotations[api.AnnotationStatus]; !strings.Contains(st, want) {
		t.Errorf("status %q", st)
	}
	if ev := e.events(ReasonUnsupported); len(ev) == 0 || !strings.Contains(ev[0], want) {
		t.Errorf("events %v", ev)
	}
}

// A replica past its renew deadline writes nothing: no allocation, finalizer or status.
func TestFenceRefusesWritesAfterRenewDeadline(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	fence := leader.NewFence(clk, 10*time.Second, 15*time.Second)
	lock := fence.Lock(&fakeLeaseLock{})
	renew := func() {
		if err := lock.Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
			t.Fatal(err)
		}
	}
	renew()
	e := newEnvWith(t, func(cfg *Config) { cfg.Fence = fence }, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c1").Memory("10Gi").Obj(), builders.MakePod("a", "p1").Claim("c1").Obj())
	e.run()
	if e.placedOn("a", "c1") == "" {
		t.Fatal("the leader did not place c1")
	}
	clk.Step(10 * time.Second) // no renew since: another replica may lead 5s from now
	e.create(builders.MakeClaim("a", "c2").Memory("10Gi").Created(5).Obj(), builders.MakePod("a", "p2").Claim("c2").Obj())
	e.run()
	c2 := e.claim("a", "c2")
	if c2.Status.Allocation != nil || len(c2.Finalizers) != 0 || len(c2.Annotations) != 0 {
		t.Fatalf("a fenced replica wrote c2: allocation %v, finalizers %v, annotations %v", c2.Status.Allocation != nil, c2.Finalizers, c2.Annotations)
	}
	_, err := e.c.Sync(e.ctx, "a/c2")
	if !errors.Is(err, leader.ErrFenced) {
		t.Fatalf("Sync: %v, want the fence's error", err)
	}
	// Nor does it take allocations back.
	_ = e.client.CoreV1().Pods("a").Delete(e.ctx, "p1", metav1.DeleteOptions{})
	e.clock.Step(time.Minute)
	e.run()
	if e.placedOn("a", "c1") == "" {
		t.Fatal("a fenced replica deallocated c1")
	}
	renew()
	e.run()
	if e.placedOn("a", "c2") == "" || e.placedOn("a", "c1") != "" {
		t.Fatalf("renewed: c2 on %q, c1 on %q; want c2 placed and c1 released", e.placedOn("a", "c2"), e.placedOn("a", "c1"))
	}
}

type fakeLeaseLock struct{ resourcelock.Interface }

func (fakeLeaseLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return nil }
func (fakeLeaseLock) Identity() string                                                { return "me" }

// refusePrepare records on a claim what the kubelet plugin does when it refuses to prepare
// the claim's device (over-commit), with the claim reserved for its pod, bound to node.
func (e *env) refusePrepare(ns, name, pod, node string) {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(ns).Get(e.ctx, pod, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p.Spec.NodeName = node
	if _, err := e.client.CoreV1().Pods(ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	c := e.claim(ns, name)
	r := c.Status.Allocation.Devices.Results[0]
	sid := string(*r.ShareID)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: p.Name, UID: p.UID}}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: r.Driver, Pool: r.Pool, Device: r.Device, ShareID: &sid,
		Conditions: []metav1.Condition{{Type: api.DeviceConditionPrepared, Status: metav1.ConditionFalse, Reason: api.PrepareReasonOverCommitted,
			Message: "refusing to over-commit GPU " + r.Device, LastTransitionTime: metav1.Now()}}}}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// A prepare the plugin refused is noticed: the claim is placed again on another GPU of the
// node its pod is bound to, reserved for that pod again, and the model counts only the new
// share.
func TestRefusedPreparePlacedAgainOnBoundNode(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	node, _, _ := strings.Cut(first, "/")
	if first == "" {
		t.Fatal("not placed")
	}
	e.refusePrepare("a", "c", "p", node)
	e.run()
	c := e.claim("a", "c")
	second := e.placedOn("a", "c")
	if second == "" || second == first || !strings.HasPrefix(second, node+"/") {
		t.Fatalf("refused on %s: now on %q; want another GPU of %s (%s)", first, second, node, c.Annotations[api.AnnotationStatus])
	}
	if len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].Name != "p" || len(c.Status.Devices) != 0 {
		t.Errorf("reservedFor %+v, devices %+v", c.Status.ReservedFor, c.Status.Devices)
	}
	ev := e.events(ReasonPrepareRefused)
	if len(ev) != 2 || !strings.Contains(ev[0], "the kubelet plugin refused to prepare "+first+" (OverCommitted: refusing to over-commit") ||
		!strings.Contains(ev[0], "placing the claim again on node "+node+", where its pod is bound") {
		t.Errorf("events %v", ev)
	}
	e.c.model.EachGPU(func(g *model.GPU) {
		want := int64(0)
		if g.KeyText() == second {
			want = 10 << 30
		}
		if g.UsedMem() != want || (want == 0) != (g.NumTenants() == 0) {
			t.Errorf("model: %s uses %d bytes, %d tenant(s); want %d", g.Key(), g.UsedMem(), g.NumTenants(), want)
		}
	})
	if used, n := e.charged("a").Mem, modelClaims(e.c.model); used != 10<<30 || n != 1 {
		t.Errorf("model: namespace a uses %d, %d claim(s)", used, n)
	}
}

// A claim that cannot be placed again says why, on the claim and its pod, while the GPU
// its plugin refused holds what it held then; once the GPU frees, it is placed there again,
// reserved for its bound pod: a one-GPU node never leaves the pod stuck.
func TestRefusedPrepareNoOtherGPUSaysWhy(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "n1/gpu-0" {
		t.Fatal("not placed")
	}
	// What over-committed the GPU shows up late: another allocation of 75Gi on it.
	e.create(builders.MakeClaim("b", "o").Memory("75Gi").AllocatedOn("n1", "gpu-0").Obj())
	e.refusePrepare("a", "c", "p", "n1")
	e.run()
	c := e.claim("a", "c")
	if c.Status.Allocation != nil || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("allocation %v, reservedFor %v", c.Status.Allocation != nil, c.Status.ReservedFor)
	}
	const why = "its kubelet plugin refused to prepare this claim on it (tried again once what the GPU holds changes, or 1m0s after the refusal)"
	if st := c.Annotations[api.AnnotationStatus]; !strings.HasPrefix(st, "Pending: ") || !strings.Contains(st, why) {
		t.Errorf("status %q", st)
	}
	if ev := e.events("claim c: Pending: "); len(ev) == 0 || !strings.Contains(ev[len(ev)-1], why) {
		t.Errorf("pod events %v", ev)
	}
	if err := e.client.ResourceV1().ResourceClaims("b").Delete(e.ctx, "o", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	c = e.claim("a", "c")
	if got := e.placedOn("a", "c"); got != "n1/gpu-0" || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].Name != "p" {
		t.Fatalf("the GPU freed: claim on %q, reservedFor %+v (%s); want n1/gpu-0 reserved for p", got, c.Status.ReservedFor, c.Annotations[api.AnnotationStatus])
	}
}

// A refused GPU whose use the model never sees change (what the plugin counted is not in
// the API) is tried again after the bind timeout, and the waiting claim asks to be looked at
// then: the bound pod of a one-GPU node is not stuck for ever.
func TestRefusedGPUTriedAgainAfterBindTimeout(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "n1/gpu-0" {
		t.Fatal("not placed")
	}
	e.refusePrepare("a", "c", "p", "n1")
	e.run()
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("placed again at once on the GPU that refused it: %q", got)
	}
	e.clock.Step(e.c.cfg.BindTimeout - time.Second)
	if after, err := e.c.Sync(e.ctx, "a/c"); err != nil || after != time.Second {
		t.Fatalf("Sync: look again after %s (%v), want 1s", after, err)
	}
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("placed again before the bind timeout: %q", got)
	}
	e.clock.Step(time.Second)
	e.run()
	c := e.claim("a", "c")
	if got := e.placedOn("a", "c"); got != "n1/gpu-0" || len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].Name != "p" {
		t.Fatalf("claim on %q, reservedFor %+v (%s); want n1/gpu-0 reserved for p", got, c.Status.ReservedFor, c.Annotations[api.AnnotationStatus])
	}
}

// The reservations kube-scheduler made survive a re-placement though the pod informer does
// not show the pods bound yet: the pods that still exist stay reserved (both pods of a
// shared claim), one that is gone is dropped, and the claim stays on the old allocation's
// node.
func TestRefusedPrepareKeepsReservationsInformerDoesNotShow(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj(),
		builders.MakePod("a", "p2").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	node, _, _ := strings.Cut(first, "/")
	if first == "" {
		t.Fatal("not placed")
	}
	other := "n1"
	if node == "n1" {
		other = "n2"
	}
	// A partly used GPU on the other node is where packing would put the claim.
	e.create(builders.MakeClaim("b", "filler").Memory("60Gi").AllocatedOn(other, "gpu-0").Obj())
	c := e.claim("a", "c")
	r := c.Status.Allocation.Devices.Results[0]
	sid := string(*r.ShareID)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
		{Resource: "pods", Name: "p", UID: "pod-a-p"}, {Resource: "pods", Name: "p2", UID: "pod-a-p2"}, {Resource: "pods", Name: "gone", UID: "pod-a-gone"}}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: r.Driver, Pool: r.Pool, Device: r.Device, ShareID: &sid,
		Conditions: []metav1.Condition{{Type: api.DeviceConditionPrepared, Status: metav1.ConditionFalse, Reason: api.PrepareReasonOverCommitted,
			Message: "refusing to over-commit GPU " + r.Device, LastTransitionTime: metav1.Now()}}}}
	if _, err := e.client.ResourceV1().ResourceClaims("a").UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	c = e.claim("a", "c")
	got := e.placedOn("a", "c")
	var names []string
	for _, r := range c.Status.ReservedFor {
		names = append(names, r.Name)
	}
	if got == "" || got == first || !strings.HasPrefix(got, node+"/") || strings.Join(names, ",") != "p,p2" {
		t.Fatalf("refused on %s: now on %q reserved for %v (%s); want another GPU of %s (not %s), reserved for p,p2",
			first, got, names, c.Annotations[api.AnnotationStatus], node, other)
	}
	if ev := e.events(ReasonPrepareRefused); len(ev) == 0 || !strings.Contains(ev[0], "placing the claim again on node "+node+", where its pod is bound") {
		t.Errorf("events %v", ev)
	}
}

// The pin to the refused allocation's node holds only for the pods it was for. The
// reserved pod is deleted (it sat in ContainerCreating) and a new pod uses the claim: the
// claim goes wherever it fits, not to the full node, and keeps no stale reservation.
func TestRefusedPreparePinDroppedWithItsPods(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	node, _, _ := strings.Cut(first, "/")
	other := "n1"
	if node == "n1" {
		other = "n2"
	}
	// The node fills up (what over-committed it shows late).
	e.create(builders.MakeClaim("b", "o").Memory("75Gi").AllocatedOn(node, "gpu-0").Obj())
	e.refusePrepare("a", "c", "p", node)
	e.run()
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("placed on %q", got)
	}
	// The user deletes the stuck pod; a new one uses the claim.
	if err := e.client.CoreV1().Pods("a").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle() // settle counts pods: the informer must not take p2 for p
	e.create(builders.MakePod("a", "p2").Claim("c").Obj())
	e.run()
	c := e.claim("a", "c")
	if got := e.placedOn("a", "c"); !strings.HasPrefix(got, other+"/") || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("claim on %q (%s), reservedFor %+v; want it on %s, not reserved: no pod is bound to %s any more",
			got, c.Annotations[api.AnnotationStatus], c.Status.ReservedFor, other, node)
	}
}

// A pod the tenant binds to another node itself does not move a claim placed again after a
// refused prepare away from the node its reserved pod is bound to; the pod is told it cannot
// use the claim there.
func TestRefusedPreparePinnedNodeWinsOverPodBoundElsewhere(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	node, _, _ := strings.Cut(first, "/")
	other := "n1"
	if node == "n1" {
		other = "n2"
	}
	e.create(builders.MakePod("a", "p3").Claim("c").Bound(other).Obj())
	e.refusePrepare("a", "c", "p", node)
	e.run()
	c := e.claim("a", "c")
	if got := e.placedOn("a", "c"); got == "" || got == first || !strings.HasPrefix(got, node+"/") ||
		len(c.Status.ReservedFor) != 1 || c.Status.ReservedFor[0].Name != "p" {
		t.Fatalf("claim on %q (%s), reservedFor %+v; want another GPU of %s, reserved for p", got, c.Annotations[api.AnnotationStatus], c.Status.ReservedFor, node)
	}
	want := "claim c is on node " + node + ", where the pods it is reserved for are bound; this pod is bound to node " + other + " and cannot use it"
	if ev := e.events(ReasonPodBoundElsewhere); len(ev) != 1 || !strings.Contains(ev[0], want) {
		t.Errorf("events %v, want one with %q", ev, want)
	}
}

// Pods that use one claim but that the tenant bound to different nodes cannot all use it (a
// claim's devices are on one node): the claim waits and says so, instead of following
// whichever pod came last; once the pods agree, it is placed.
func TestPodsBoundToDifferentNodesRefused(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(),
		builders.MakePod("a", "p1").Claim("c").Bound("n1").Obj(), builders.MakePod("a", "p2").Claim("c").Bound("n2").Obj())
	e.run()
	c := e.claim("a", "c")
	const why = "Pending: the pods that use the claim are bound to different nodes (p1 on n1, p2 on n2), but a claim's devices are all on one node: delete the pods bound to the wrong node, or leave spec.nodeName unset and let the scheduler choose"
	if c.Status.Allocation != nil || c.Annotations[api.AnnotationStatus] != why {
		t.Fatalf("allocation %v, status %q; want %q", c.Status.Allocation != nil, c.Annotations[api.AnnotationStatus], why)
	}
	// One event on each pod; the claim's annotation says it, with no event on the claim
	// to write as well.
	if ev := e.events(ReasonPodBoundElsewhere); len(ev) != 2 || !strings.HasPrefix(ev[0], "Warning "+ReasonPodBoundElsewhere+" claim c: ") || !strings.HasPrefix(ev[1], "Warning "+ReasonPodBoundElsewhere+" claim c: ") {
		t.Errorf("events %v, want one on each pod", ev)
	}
	if err := e.client.CoreV1().Pods("a").Delete(e.ctx, "p1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	if got := e.placedOn("a", "c"); got != "n2/gpu-0" {
		t.Fatalf("claim on %q (%s), want n2/gpu-0", got, e.claim("a", "c").Annotations[api.AnnotationStatus])
	}
}

// A refusal recorded for an earlier allocation of the same device (another share ID) does
// not take back the current one, whose pod may be running on it.
func TestStaleRefusalOfOtherShareIgnored(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Bound("n1").Obj())
	e.run()
	if e.placedOn("a", "c") != "n1/gpu-0" {
		t.Fatal("not placed")
	}
	c := e.claim("a", "c")
	r := c.Status.Allocation.Devices.Results[0]
	stale := "an-earlier-share"
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: "pod-a-p"}}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: r.Driver, Pool: r.Pool, Device: r.Device, ShareID: &stale,
		Conditions: []metav1.Condition{{Type: api.DeviceConditionPrepared, Status: metav1.ConditionFalse, Reason: api.PrepareReasonOverCommitted,
			Message: "refusing to over-commit GPU " + r.Device, LastTransitionTime: metav1.Now()}}}}
	if _, err := e.client.ResourceV1().ResourceClaims("a").UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	now := e.claim("a", "c")
	if now.Status.Allocation == nil || *now.Status.Allocation.Devices.Results[0].ShareID != *r.ShareID || len(now.Status.ReservedFor) != 1 {
		t.Fatalf("a stale refusal took the allocation back: allocation %v, reservedFor %v", now.Status.Allocation != nil, now.Status.ReservedFor)
	}
	if ev := e.events(ReasonPrepareRefused); len(ev) != 0 {
		t.Errorf("events %v", ev)
	}
}

// Only a re-placement writes reservedFor: a pod that names its node itself (no
// kube-scheduler) gets an allocation on that node, not a reservation that would let the
// kubelet prepare it without the scheduler's node checks.
func TestBoundPodNotReservedByPlacement(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Bound("n2").Obj())
	e.run()
	c := e.claim("a", "c")
	if got := e.placedOn("a", "c"); got != "n2/gpu-0" || len(c.Status.ReservedFor) != 0 {
		t.Fatalf("claim on %q, reservedFor %+v; want n2/gpu-0, not reserved", got, c.Status.ReservedFor)
	}
}

// A tenant that keeps removing the finalizer gets it restored, with an event, at most once a
// minute per claim: not an Update and an event per removal.
func TestFinalizerRestoredAtMostOnceAMinute(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Bound("n1").Obj())
	e.run()
	if e.placedOn("a", "c") == "" {
		t.Fatal("not placed")
	}
	strip := func(c *resourceapi.ResourceClaim) { c.Finalizers = []string{resourceapi.Finalizer} }
	e.tamper("a", "c", strip)
	e.run()
	if !hasFinalizer(e.claim("a", "c"), api.FinalizerAllocator) {
		t.Fatal("finalizer not restored")
	}
	e.tamper("a", "c", strip)
	e.run()
	if hasFinalizer(e.claim("a", "c"), api.FinalizerAllocator) {
		t.Error("finalizer restored twice within a minute")
	}
	if ev := e.events(ReasonFinalizerRestored); len(ev) != 1 {
		t.Errorf("events within a minute %v, want one", ev)
	}
	e.clock.Step(restoreInterval)
	e.run()
	if !hasFinalizer(e.claim("a", "c"), api.FinalizerAllocator) {
		t.Error("finalizer not restored a minute later")
	}
	if ev := e.events(ReasonFinalizerRestored); len(ev) != 2 {
		t.Errorf("events after a minute %v, want two", ev)
	}
}

// A claim placed by an allocator older than the Placement record has none in its allocation,
// but its results tolerate the fence, which only the allocator writes: after an upgrade the
// allocator still takes it back when its pod does not bind, and places it again. An
// allocation without the toleration (kube-scheduler's) is left alone.
func TestUpgradeOlderAllocatorsClaimStaysManaged(t *testing.T) {
	older := builders.MakeClaim("a", "old").Memory("10Gi").AllocatedOn("n1", "gpu-0").Obj()
	older.Finalizers = []string{api.FinalizerAllocator, resourceapi.Finalizer}
	older.Status.Allocation.Devices.Results[0].Tolerations = []resourceapi.DeviceToleration{api.FenceToleration()}
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"), older,
		builders.MakeClaim("a", "sched").Memory("10Gi").AllocatedOn("n1", "gpu-0").Obj(),
		builders.MakePod("a", "p1").Claim("old").Obj(), builders.MakePod("a", "p2").Claim("sched").Obj())
	if !PlacedByAllocator(api.DriverName, older) {
		t.Fatal("an allocation tolerating the fence does not count as the allocator's")
	}
	e.clock.Step(2 * time.Minute) // the pods never bound
	e.run()
	if got := e.placedOn("a", "old"); got != "n2/gpu-0" {
		t.Errorf("the older allocator's claim is on %q after its bind timeout; want it placed again away from n1 (n2/gpu-0)", got)
	}
	if p := allocCfg(t, e.claim("a", "old")).Placement; p == nil {
		t.Error("placed again without a Placement")
	}
	if got := e.placedOn("a", "sched"); got != "n1/gpu-0" {
		t.Errorf("kube-scheduler's claim is on %q; want it left on n1/gpu-0", got)
	}
}
