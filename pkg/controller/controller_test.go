package controller

import (
	"fmt"

	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

func TestPlacementWritesValidAllocation(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Compute("12").Config(map[string]any{"memoryLimit": "8Gi"}).Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	c := e.claim("a", "c")
	a := c.Status.Allocation
	if a == nil {
		t.Fatalf("not allocated; status annotation %q", c.Annotations[api.AnnotationStatus])
	}
	if a.AllocationTimestamp == nil {
		t.Error("no allocationTimestamp: the pod would never bind")
	}
	ns := a.NodeSelector
	if ns == nil || len(ns.NodeSelectorTerms) != 1 || len(ns.NodeSelectorTerms[0].MatchFields) != 1 ||
		ns.NodeSelectorTerms[0].MatchFields[0].Key != "metadata.name" || len(ns.NodeSelectorTerms[0].MatchFields[0].Values) != 1 ||
		ns.NodeSelectorTerms[0].MatchFields[0].Values[0] != "n1" || len(ns.NodeSelectorTerms[0].MatchExpressions) != 0 {
		t.Errorf("node selector %+v", ns)
	}
	if len(a.Devices.Results) != 1 {
		t.Fatalf("results %+v", a.Devices.Results)
	}
	r := a.Devices.Results[0]
	if r.Request != "gpu" || r.Driver != api.DriverName || r.Pool != "n1" || !strings.HasPrefix(r.Device, "gpu-") {
		t.Errorf("result %+v", r)
	}
	if r.ShareID == nil || !uuidRE.MatchString(string(*r.ShareID)) {
		t.Errorf("shareID %v is not a lowercase dashed UUID", r.ShareID)
	}
	if m := r.ConsumedCapacity[api.CapacityMemory]; m.Value() != 10<<30 {
		t.Errorf("consumed memory %s", m.String())
	}
	if cp := r.ConsumedCapacity[api.CapacityCompute]; cp.Value() != 12 {
		t.Errorf("consumed compute %s", cp.String())
	}
	if len(r.Tolerations) == 0 || r.Tolerations[0] != api.FenceToleration() {
		t.Errorf("tolerations %+v lack the fence toleration", r.Tolerations)
	}
	// The user's config is kept and the allocator's comes last.
	cfgs := a.Devices.Config
	if len(cfgs) != 2 || cfgs[0].Source != resourceapi.AllocationConfigSourceClaim || cfgs[1].Source != resourceapi.AllocationConfigSourceClaim {
		t.Fatalf("configs %+v", cfgs)
	}
	got, err := api.DecodeGpuConfig(cfgs[1].Opaque.Parameters.Raw)
	if err != nil {
		t.Fatal(err)
	}
	if got.Mode != api.SharingModeMPS || got.IsolationDomain != api.DefaultIsolationDomain || got.MemoryLimit == nil || got.MemoryLimit.String() != "8Gi" ||
		got.Placement == nil || got.Placement.AllowSharedGPU {
		t.Errorf("allocator config %+v", got)
	}
	if !hasFinalizer(c, api.FinalizerAllocator) || !hasFinalizer(c, resourceapi.Finalizer) {
		t.Errorf("finalizers %v", c.Finalizers)
	}
	if !PlacedByAllocator(api.DriverName, c) || !strings.Contains(c.Annotations[api.AnnotationStatus], "placed on n1/gpu-") {
		t.Errorf("annotations %v", c.Annotations)
	}
	// One event, on the pod (it names the claim); the claim carries the annotation.
	if ev := e.events("FgpuPlaced"); len(ev) != 1 || !strings.Contains(ev[0], "claim "+c.Name+": ") || !strings.Contains(ev[0], "placed on n1/gpu-") || !strings.Contains(ev[0], "10Gi, 12% compute, MPS") {
		t.Errorf("placement events %v", ev)
	}
}

func TestWaitsForPod(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), builders.MakeClaim("a", "c").Memory("10Gi").Obj())
	e.run()
	if e.placedOn("a", "c") != "" {
		t.Fatal("a claim no pod uses was allocated")
	}
	e.create(builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") == "" {
		t.Fatal("not placed once a pod uses it")
	}
}

// Kueue gates the pods it has not admitted: their claims hold no GPU until the gate is gone.
func TestWaitsWhilePodIsSchedulingGated(t *testing.T) {
	gated := builders.MakePod("a", "p").Claim("c").Obj()
	gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "kueue.x-k8s.io/admission"}}
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), builders.MakeClaim("a", "c").Memory("10Gi").Obj(), gated)
	e.run()
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("placed on %s while its only pod is scheduling-gated", got)
	}
	// It waits for Kueue, not for a GPU: a scaler on the pending gauges must not grow for it.
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(`
# HELP fgpu_allocator_pending_claims fgpu claims a pod may use that wait for an allocation.
# TYPE fgpu_allocator_pending_claims gauge
fgpu_allocator_pending_claims 0
`), "fgpu_allocator_pending_claims", "fgpu_allocator_namespace_pending_claims"); err != nil {
		t.Errorf("pending gauges count a claim whose pods are all gated: %v", err)
	}
	gated.Spec.SchedulingGates = nil
	if _, err := e.client.CoreV1().Pods("a").Update(e.ctx, gated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if p, err := e.c.pods.Pods("a").Get("p"); err == nil && len(p.Spec.SchedulingGates) == 0 {
			break
		}
	}
	e.run()
	if e.placedOn("a", "c") == "" {
		t.Fatal("not placed once its pod is ungated")
	}
}

// A pod that Kueue admitted and fgpu's own quota holds back says that both set quota: the
// two must not disagree about a namespace.
func TestOverQuotaKueuePodSaysBothQuotasBind(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").QuotaMemory("10Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c1").Memory("10Gi").Created(0).Obj(), builders.MakePod("a", "p1").Claim("c1").Obj(),
		builders.MakeClaim("a", "c2").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "p2").Claim("c2").Label("kueue.x-k8s.io/podset", "main").Obj())
	e.run()
	if e.placedOn("a", "c2") != "" {
		t.Fatal("c2 placed over the 10Gi quota")
	}
	ev := e.events("FgpuOverQuota")
	if len(ev) != 1 || !strings.Contains(ev[0], "claim c2: ") || !strings.Contains(ev[0], "Kueue admitted this pod") {
		t.Errorf("over-quota events %v", ev)
	}
}

func TestAccountsSchedulerAllocations(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("a", "old").Memory("70Gi").AllocatedOn("n1", "gpu-0").Obj(),
		builders.MakeClaim("a", "new").Memory("20Gi").Obj(), builders.MakePod("a", "p").Claim("new").Obj())
	e.run()
	if got := e.placedOn("a", "new"); got != "n1/gpu-1" {
		t.Fatalf("placed on %q; gpu-0 has only 10Gi free", got)
	}
}

func TestIsolationNamespace(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj(),
		builders.MakeClaim("b", "c").Memory("10Gi").Created(1).Obj(), builders.MakePod("b", "p").Claim("c").Obj()}
	e := newEnv(t, nil, objs...)
	e.run()
	if e.placedOn("a", "c") == "" || e.placedOn("b", "c") != "" {
		t.Fatalf("namespaces a and b shared a GPU by default: %q %q", e.placedOn("a", "c"), e.placedOn("b", "c"))
	}
	if ev := e.events("isolation"); len(ev) == 0 {
		t.Errorf("no event says why b waits: %v", e.events(""))
	}

	// allowSharedGPU: same GPU, separate MPS servers (domains).
	e2 := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("shared").AllowShared().Obj()}, objs...)
	e2.run()
	if e2.placedOn("a", "c") != "n1/gpu-0" || e2.placedOn("b", "c") != "n1/gpu-0" {
		t.Fatalf("allowSharedGPU: %q %q", e2.placedOn("a", "c"), e2.placedOn("b", "c"))
	}
	for _, ns := range []string{"a", "b"} {
		if pl := allocCfg(t, e2.claim(ns, "c")).Placement; pl == nil || !pl.AllowSharedGPU {
			t.Errorf("claim of %s: placement %+v does not say other domains may share the GPU", ns, pl)
		}
		if d := domainsOn(e2, "n1", "gpu-0")[ns+"/c"]; d != ns+"/default" {
			t.Errorf("claim of %s is in domain %q", ns, d)
		}
	}
}

func TestIsolationNoneShares(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj(),
		builders.MakeClaim("b", "c").Memory("10Gi").Obj(), builders.MakePod("b", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "n1/gpu-0" || e.placedOn("b", "c") != "n1/gpu-0" {
		t.Fatal("isolation none did not share")
	}
	if d := allocCfg(t, e.claim("b", "c")).IsolationDomain; d != api.DefaultIsolationDomain {
		t.Errorf("domain %q", d)
	}
}

func TestIsolationExclusiveTakesWholeGPU(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("x").Isolation(api.IsolationExclusive).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("a", "c1").Memory("10Gi").Obj(), builders.MakePod("a", "p1").Claim("c1").Obj(),
		builders.MakeClaim("a", "c2").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "p2").Claim("c2").Obj(),
		builders.MakeClaim("a", "c3").Memory("10Gi").Created(2).Obj(), builders.MakePod("a", "p3").Claim("c3").Obj())
	e.run()
	if e.placedOn("a", "c1") == e.placedOn("a", "c2") || e.placedOn("a", "c3") != "" {
		t.Fatalf("exclusive: %q %q %q", e.placedOn("a", "c1"), e.placedOn("a", "c2"), e.placedOn("a", "c3"))
	}
	r := e.claim("a", "c1").Status.Allocation.Devices.Results[0]
	if m := r.ConsumedCapacity[api.CapacityMemory]; m.String() != "80Gi" {
		t.Errorf("exclusive claim consumed %s, want the whole GPU", m.String())
	}
}

func TestExclusiveClass(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "w").Class(api.DeviceClassExclusive).Obj(), builders.MakePod("a", "p").Claim("w").Obj(),
		builders.MakeClaim("a", "s").Memory("1Gi").Created(1).Obj(), builders.MakePod("a", "q").Claim("s").Obj())
	e.run()
	if e.placedOn("a", "w") != "n1/gpu-0" || e.placedOn("a", "s") != "" {
		t.Fatalf("whole GPU shared: %q %q", e.placedOn("a", "w"), e.placedOn("a", "s"))
	}
}

func TestLatencyCritical(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("crit").Latency(api.LatencyCritical).MaxCo(1).Isolation(api.IsolationNone).Namespaces("kubernetes.io/metadata.name", "a").Pods("tier", "critical").Priority(10).Obj(),
		builders.MakePolicy("rest").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("a"),
		builders.MakeClaim("a", "be1").Memory("10Gi").Obj(), builders.MakePod("a", "be1").Claim("be1").Obj())
	e.run()
	// The critical claim takes the least-loaded GPU: the empty one.
	e.create(builders.MakeClaim("a", "crit1").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "crit1").Claim("crit1").Label("tier", "critical").Obj())
	e.run()
	if e.placedOn("a", "crit1") == e.placedOn("a", "be1") {
		t.Fatalf("critical claim put next to a tenant while an empty GPU was free")
	}
	// Another critical claim never shares with the first; best-effort ones fill up to
	// maxCoTenants 1 next to it.
	e.create(builders.MakeClaim("a", "crit2").Memory("10Gi").Created(2).Obj(), builders.MakePod("a", "crit2").Claim("crit2").Label("tier", "critical").Obj(),
		builders.MakeClaim("a", "be2").Memory("10Gi").Created(3).Obj(), builders.MakePod("a", "be2").Claim("be2").Obj(),
		builders.MakeClaim("a", "be3").Memory("10Gi").Created(4).Obj(), builders.MakePod("a", "be3").Claim("be3").Obj())
	e.run()
	crit1 := e.placedOn("a", "crit1")
	if e.placedOn("a", "crit2") == crit1 {
		t.Error("two critical claims share a GPU")
	}
	n := 0
	for _, c := range []string{"be1", "be2", "be3", "crit2"} {
		if e.placedOn("a", c) == crit1 {
			n++
		}
	}
	if n > 1 {
		t.Errorf("critical claim with maxCoTenants 1 has %d co-tenants", n)
	}
}

// A claim turned away by a co-tenant learns the claim's name only where it is its own
// namespace's: a claim's status and events are read by its namespace.
func TestCoTenantRefusalNamesNoOtherNamespacesClaim(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("crit").Latency(api.LatencyCritical).MaxCo(0).Isolation(api.IsolationNone).Namespaces("kubernetes.io/metadata.name", "a").Pods("tier", "critical").Priority(10).Obj(),
		builders.MakePolicy("rest").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), namespaceObj("a"), namespaceObj("b"),
		builders.MakeClaim("a", "secret-model").Memory("10Gi").Obj(), builders.MakePod("a", "secret-model").Claim("secret-model").Label("tier", "critical").Obj())
	e.run()
	if e.placedOn("a", "secret-model") == "" {
		t.Fatal("critical claim not placed")
	}
	e.create(builders.MakeClaim("b", "other").Memory("1Gi").Created(1).Obj(), builders.MakePod("b", "other").Claim("other").Obj())
	e.run()
	ev := e.events("a critical tenant allows no more co-tenants")
	if len(ev) != 1 {
		t.Fatalf("other namespace's claim refusal events: %q", ev)
	}
	if !strings.Contains(ev[0], "n1/gpu-0") || strings.Contains(ev[0], "secret-model") {
		t.Errorf("another namespace's refusal should name the GPU, not the claim: %q", ev[0])
	}
	e.create(builders.MakeClaim("a", "mine").Memory("1Gi").Created(2).Obj(), builders.MakePod("a", "mine").Claim("mine").Obj())
	e.run()
	if ev := e.events("a/secret-model"); len(ev) != 1 || !strings.Contains(ev[0], "a critical tenant allows no more co-tenants") {
		t.Errorf("the same namespace's refusal should name its claim: %q", ev)
	}
}

func TestMaxTenantsAndBestEffortPacks(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).MaxTenants(2).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"))
	for i, n := range []string{"c1", "c2", "c3", "c4", "c5"} {
		e.create(builders.MakeClaim("a", n).Memory("1Gi").Created(i).Obj(), builders.MakePod("a", n).Claim(n).Obj())
	}
	e.run()
	count := map[string]int{}
	for _, n := range []string{"c1", "c2", "c3", "c4", "c5"} {
		count[e.placedOn("a", n)]++
	}
	if count["n1/gpu-0"] != 2 || count["n1/gpu-1"] != 2 || count[""] != 1 {
		t.Fatalf("maxTenantsPerGPU 2, packing: %v", count)
	}
	if ev := e.events("maxTenantsPerGPU"); len(ev) == 0 {
		t.Error("no event names maxTenantsPerGPU")
	}
}

func TestComputeFromMemoryAndTimeSlicing(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).ComputeFromMemory().Mode(api.PolicyModeTimeSlicing).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	c := e.claim("a", "c")
	if cp := c.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityCompute]; cp.Value() != 13 {
		t.Errorf("compute %s, want ceil(10/80*100)=13", cp.String())
	}
	if m := allocCfg(t, c).Mode; m != api.SharingModeTimeSlicing {
		t.Errorf("mode %s", m)
	}
}

func TestQuotaFIFO(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("20Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"))
	for i, n := range []string{"c1", "c2", "c3"} {
		e.create(builders.MakeClaim("a", n).Memory("10Gi").Created(i).Obj(), builders.MakePod("a", n).Claim(n).Obj())
	}
	e.create(builders.MakeClaim("a", "small").Memory("1Gi").Created(5).Obj(), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	if e.placedOn("a", "c1") == "" || e.placedOn("a", "c2") == "" || e.placedOn("a", "c3") != "" {
		t.Fatal("quota 20Gi: want c1, c2 placed and c3 pending")
	}
	if e.placedOn("a", "small") != "" {
		t.Fatal("a later claim jumped the quota queue")
	}
	ev := e.events("FgpuOverQuota")
	if len(ev) == 0 || !strings.Contains(ev[0], "20Gi") || !strings.Contains(ev[0], "10Gi over") {
		t.Errorf("over-quota events %v", ev)
	}
	if st := e.claim("a", "c3").Annotations[api.AnnotationStatus]; !strings.Contains(st, "quota") {
		t.Errorf("status annotation %q", st)
	}
	// Free quota: c3 goes first, then small.
	if err := e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	if e.placedOn("a", "c3") == "" {
		t.Fatal("c3 not placed after quota freed")
	}
	if e.placedOn("a", "small") != "" {
		t.Fatal("small placed though c2+c3 use the whole quota")
	}
}

// A claim whose pod is gone is not placed, so it must not hold its namespace's quota queue.
func TestQuotaQueueReleasedByClaimWithoutPod(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("20Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("a", "used").Memory("10Gi").Created(0).Obj(), builders.MakePod("a", "used").Claim("used").Obj(),
		builders.MakeClaim("a", "big").Memory("15Gi").Created(1).Obj(), builders.MakePod("a", "big").Claim("big").Obj(),
		builders.MakeClaim("a", "small").Memory("5Gi").Created(2).Obj(), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	if e.placedOn("a", "used") == "" || e.placedOn("a", "big") != "" || e.placedOn("a", "small") != "" {
		t.Fatal("quota 20Gi with 10Gi used: want big waiting for quota and small queued behind it")
	}
	if err := e.client.CoreV1().Pods("a").Delete(e.ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	if e.placedOn("a", "small") == "" {
		t.Fatalf("small still waits behind a claim no pod uses: %s", e.claim("a", "small").Annotations[api.AnnotationStatus])
	}
}

func TestTimeoutAndReplace(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeNode("n2").Obj(), builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	first := e.placedOn("a", "c")
	if first == "" {
		t.Fatal("not placed")
	}
	e.clock.Step(2 * time.Minute) // the pod never bound
	e.run()
	second := e.placedOn("a", "c")
	if second == "" || second == first {
		t.Fatalf("after the bind timeout: first %q, now %q; want another node", first, second)
	}
	if ev := e.events(ReasonTimedOut); len(ev) < 2 {
		t.Errorf("timeout events %v", ev)
	}
}

func TestDeallocatesWhenPodGone(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") == "" {
		t.Fatal("not placed")
	}
	_ = e.client.CoreV1().Pods("a").Delete(e.ctx, "p", metav1.DeleteOptions{})
	e.clock.Step(time.Minute)
	e.run()
	if e.placedOn("a", "c") != "" {
		t.Fatal("allocation kept though no pod uses the claim")
	}
	if n := modelClaims(e.c.model); n != 0 {
		t.Errorf("state still holds %d claims", n)
	}
}

func TestDeletedClaimReleased(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	c := e.claim("a", "c")
	now := metav1.Now()
	c.DeletionTimestamp = &now
	if _, err := e.client.ResourceV1().ResourceClaims("a").Update(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	c = e.claim("a", "c")
	if c.Status.Allocation != nil || hasFinalizer(c, api.FinalizerAllocator) {
		t.Fatalf("deleted claim still allocated (%v) or holds the finalizer %v", c.Status.Allocation != nil, c.Finalizers)
	}
}

func TestPodFit(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).Obj()},
		builders.MakeNode("tainted").Taint("dedicated", "x").Obj(), builders.MakeNode("small").CPU("1").Obj(), builders.MakeNode("other").Label("zone", "b").Obj(), builders.MakeNode("good").Label("zone", "a").Obj(),
		builders.MakeSlice("tainted", 1, "80Gi"), builders.MakeSlice("small", 1, "80Gi"), builders.MakeSlice("other", 1, "80Gi"), builders.MakeSlice("good", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").CPU("2").NodeSelector("zone", "a").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "good/gpu-0" {
		t.Fatalf("placed on %q, the only node the pod fits is good", got)
	}
	e.create(builders.MakeClaim("a", "d").Memory("10Gi").Obj(), builders.MakePod("a", "q").Claim("d").CPU("2").NodeSelector("zone", "c").Obj())
	e.run()
	if e.placedOn("a", "d") != "" {
		t.Fatal("placed a claim whose pod fits no node")
	}
	if ev := e.events("pod does not fit"); len(ev) == 0 {
		t.Errorf("no event says the pod fits no node: %v", e.events("d"))
	}
}

// Node verdicts are remembered across decisions (fitsNode): a changed Node must be judged
// again, not by what its previous version said.
func TestPodFitFollowsNodeUpdates(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).Obj()},
		builders.MakeNode("n1").Label("zone", "a").Obj(), builders.MakeNode("n2").Label("zone", "b").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").NodeSelector("zone", "a").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "n1/gpu-0" {
		t.Fatalf("placed on %q, want n1/gpu-0", got)
	}
	for name, zone := range map[string]string{"n1": "c", "n2": "a"} {
		n, err := e.client.CoreV1().Nodes().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Labels["zone"] = zone
		if _, err := e.client.CoreV1().Nodes().Update(e.ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n1, err1 := e.c.nodes.Get("n1")
		n2, err2 := e.c.nodes.Get("n2")
		if err1 == nil && err2 == nil && n1.Labels["zone"] == "c" && n2.Labels["zone"] == "a" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the informer never showed the relabelled nodes")
		}
	}
	e.create(builders.MakeClaim("a", "d").Memory("10Gi").Obj(), builders.MakePod("a", "q").Claim("d").NodeSelector("zone", "a").Obj())
	e.run()
	if got := e.placedOn("a", "d"); got != "n2/gpu-0" {
		t.Fatalf("placed on %q, want n2/gpu-0 (n1 is zone c now)", got)
	}
}

func TestPodFitCountsBoundPods(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("p").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj()},
		builders.MakeNode("n1").CPU("4").Obj(), builders.MakeNode("n2").CPU("4").Obj(), builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"),
		builders.MakePod("x", "hog").CPU("3").Bound("n1").Obj(),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").CPU("2").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "n2/gpu-0" {
		t.Fatalf("placed on %q; n1 has 1 CPU left", got)
	}
}

func TestUnsupportedRequestSaysWhy(t *testing.T) {
	c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
	c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: "nic",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "nic.example.com", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}})
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "" {
		t.Fatal("mixed claim allocated")
	}
	if ev := e.events("nic.example.com"); len(ev) == 0 {
		t.Error("no event explains the mixed claim")
	}
}

func allocCfg(t *testing.T, c *resourceapi.ResourceClaim) *api.GpuConfig {
	t.Helper()
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated", c.Name)
	}
	return model.AllocationConfig(api.DriverName, c.Status.Allocation.Devices.Config, c.Status.Allocation.Devices.Results[0].Request)
}

var _ = corev1.PodScheduled

func TestRequestSelectorAndDeviceTaint(t *testing.T) {
	sl := builders.MakeSlice("n1", 3, "80Gi")
	// gpu-0 is unhealthy: the plugin tainted it.
	sl.Spec.Devices[0].Taints = append(sl.Spec.Devices[0].Taints, resourceapi.DeviceTaint{Key: "gpu.fgpu.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
	c.Spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["gpu.fgpu.dev"].index != 1`}}}
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), sl, c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "n1/gpu-2" {
		t.Fatalf("placed on %q; gpu-0 is tainted and the selector excludes gpu-1", got)
	}
}

func TestFirstAvailableAndWholeGPUs(t *testing.T) {
	c := builders.MakeClaim("a", "c").Obj()
	c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "big", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4},
		{Name: "two", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
	}}
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 3, "80Gi"), c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	got := e.claim("a", "c")
	if got.Status.Allocation == nil {
		t.Fatalf("not placed: %s", got.Annotations[api.AnnotationStatus])
	}
	res := got.Status.Allocation.Devices.Results
	if len(res) != 2 || res[0].Request != "gpu/two" || res[0].Device == res[1].Device {
		t.Fatalf("want two whole GPUs for subrequest gpu/two, got %+v", res)
	}
	for _, r := range res {
		if m := r.ConsumedCapacity[api.CapacityMemory]; m.String() != "80Gi" {
			t.Errorf("whole GPU consumed %s", m.String())
		}
	}
}

func TestClassConfigCopiedAndUserModeKept(t *testing.T) {
	class := builders.MakeClass("mps-class.example")
	raw := []byte(`{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig","computePercent":5}`)
	class.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DriverName, Parameters: runtime.RawExtension{Raw: raw}}}}}
	e := newEnvWith(t, func(cfg *Config) { cfg.DeviceClasses = append(cfg.DeviceClasses, "mps-class.example") },
		[]*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), class,
		builders.MakeClaim("a", "c").Class("mps-class.example").Memory("10Gi").Compute("20").Config(map[string]any{"mode": "timeSlicing"}).Obj(),
		builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	cl := e.claim("a", "c")
	if cl.Status.Allocation == nil {
		t.Fatalf("not placed: %s", cl.Annotations[api.AnnotationStatus])
	}
	cfgs := cl.Status.Allocation.Devices.Config
	if len(cfgs) != 3 || cfgs[0].Source != resourceapi.AllocationConfigSourceClass {
		t.Fatalf("want class, claim and allocator configs, got %+v", cfgs)
	}
	got := allocCfg(t, cl)
	if got.Mode != api.SharingModeTimeSlicing || got.ComputePercent == nil || *got.ComputePercent != 5 {
		t.Errorf("merged config %+v: want the user's timeSlicing and the class's computePercent 5", got)
	}
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Compute("12").Obj(), builders.MakePod("a", "p").Claim("c").Obj(),
		builders.MakeClaim("a", "big").Memory("100Gi").Obj(), builders.MakePod("a", "q").Claim("big").Obj())
	e.run()
	gpu := strings.TrimPrefix(e.placedOn("a", "c"), "n1/")
	want := fmt.Sprintf(`
# HELP fgpu_allocator_gpu_allocated_memory_bytes GPU memory allocated to claims.
# TYPE fgpu_allocator_gpu_allocated_memory_bytes gauge
fgpu_allocator_gpu_allocated_memory_bytes{gpu="%s",node="n1"} 1.073741824e+10
`, gpu)
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "fgpu_allocator_gpu_allocated_memory_bytes"); err != nil {
		// The other GPU is reported at 0 too: compare the one that holds the claim.
		mfs, _ := e.reg.Gather()
		found := false
		for _, mf := range mfs {
			if mf.GetName() != "fgpu_allocator_gpu_allocated_memory_bytes" {
				continue
			}
			for _, m := range mf.Metric {
				for _, l := range m.Label {
					if l.GetName() == "gpu" && l.GetValue() == gpu && m.Gauge.GetValue() == 10<<30 {
						found = true
					}
				}
			}
		}
		if !found {
			t.Errorf("allocated memory metric: %v", err)
		}
	}
	for name, v := range map[string]float64{"fgpu_allocator_pending_claims": 1, "fgpu_allocator_claims_placed_total": 1} {
		mfs, _ := e.reg.Gather()
		got := -1.0
		for _, mf := range mfs {
			if mf.GetName() == name {
				m := mf.Metric[0]
				if m.Gauge != nil {
					got = m.Gauge.GetValue()
				} else {
					got = m.Counter.GetValue()
				}
			}
		}
		if got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}
	if n, err := testutil.GatherAndCount(e.reg, "fgpu_allocator_decision_seconds", "fgpu_allocator_fragmentation_ratio", "fgpu_allocator_gpu_tenants", "fgpu_allocator_gpu_allocated_compute_percent"); err != nil || n < 6 {
		t.Errorf("metrics missing: %d series, %v", n, err)
	}
}

// Two shares of GPUs through MPS in one claim (two requests) are refused at allocation: the
// plugin would refuse to prepare them, and the bound pod would wait for ever.
func TestTwoMPSSharesInOneClaimRefused(t *testing.T) {
	c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
	second := *c.Spec.Devices.Requests[0].DeepCopy()
	second.Name = "gpu2"
	c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, second)
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "" {
		t.Fatal("a claim with two MPS shares was allocated")
	}
	if ev := e.events(ReasonUnsupported); len(ev) == 0 || !strings.Contains(ev[0], "one MPS server") {
		t.Errorf("events %v: want FgpuUnsupported naming the one MPS server", ev)
	}
	if modelClaims(e.c.model) != 0 {
		t.Error("the refused claim's shares stayed in the model")
	}
}

// A GPU the plugin fenced for a fault takes no claim, and the wait reason names the taint.
func TestFaultTaintedGPUTakesNoClaimAndTheReasonSaysWhy(t *testing.T) {
	sl := builders.MakeSlice("n1", 1, "80Gi")
	sl.Spec.Devices[0].Taints = append(sl.Spec.Devices[0].Taints, resourceapi.DeviceTaint{Key: "fgpu.dev/gpu-fault", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
	c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), sl, c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	got := e.claim("a", "c")
	if got.Status.Allocation != nil {
		t.Fatal("placed on a GPU tainted for a fault")
	}
	if msg := got.Annotations[api.AnnotationStatus]; !strings.Contains(msg, "fgpu.dev/gpu-fault=xid-79:NoExecute") {
		t.Errorf("the wait reason does not name the taint: %q", msg)
	}
}

// A claim that tolerates a fault's NoExecute taint for a while only (so that its pod's status
// can show the unhealthy device before the eviction) is not placed on the faulty GPU: it
// would be evicted again once the toleration ran out. Tolerating it for good places it.
func TestTimedNoExecuteTolerationPlacesNothingOnTheFaultyGPU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seconds *int64
		placed  bool
	}{
		{"for a while", ptr.To[int64](5), false},
		{"for good", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sl := builders.MakeSlice("n1", 1, "80Gi")
			sl.Spec.Devices[0].Taints = append(sl.Spec.Devices[0].Taints, resourceapi.DeviceTaint{Key: "fgpu.dev/gpu-fault", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
			c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
			c.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{
				Key: "fgpu.dev/gpu-fault", Operator: resourceapi.DeviceTolerationOpExists,
				Effect: resourceapi.DeviceTaintEffectNoExecute, TolerationSeconds: tc.seconds}}
			e := newEnv(t, nil, builders.MakeNode("n1").Obj(), sl, c, builders.MakePod("a", "p").Claim("c").Obj())
			e.run()
			if placed := e.claim("a", "c").Status.Allocation != nil; placed != tc.placed {
				t.Errorf("placed on the faulty GPU: %v, want %v", placed, tc.placed)
			}
		})
	}
}
