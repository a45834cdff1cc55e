package controller

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The allocator's writes are counted by verb and resource as the client sends them; reads
// are not.
func TestCountWrites(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	c := &http.Client{Transport: m.CountWrites(http.DefaultTransport)}
	for _, r := range []struct{ method, path string }{
		{http.MethodPut, "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c"},
		{http.MethodPut, "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c/status"},
		{http.MethodPut, "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/d/status"},
		{http.MethodPost, "/api/v1/namespaces/a/events"},
		{http.MethodPatch, "/api/v1/namespaces/a/events/e"},
		{http.MethodPut, "/apis/fgpu.dev/v1alpha1/sharingpolicies/p/status"},
		{http.MethodGet, "/apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c"},
	} {
		req, err := http.NewRequest(r.method, srv.URL+r.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	want := `
# HELP fgpu_allocator_api_writes_total Requests that write to the API server (events included), by verb and resource[/subresource]: over fgpu_allocator_claims_placed_total, the writes per placed claim.
# TYPE fgpu_allocator_api_writes_total counter
fgpu_allocator_api_writes_total{resource="events",verb="create"} 1
fgpu_allocator_api_writes_total{resource="events",verb="patch"} 1
fgpu_allocator_api_writes_total{resource="resourceclaims",verb="update"} 1
fgpu_allocator_api_writes_total{resource="resourceclaims/status",verb="update"} 2
fgpu_allocator_api_writes_total{resource="sharingpolicies/status",verb="update"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fgpu_allocator_api_writes_total"); err != nil {
		t.Error(err)
	}
}

// Per-namespace series come from the allocator's state at scrape time: what each namespace
// holds and waits for, its quota and the policy that sets it, placements and refusals by
// reason; per-GPU series carry capacity, namespaces and fragmented memory.
func TestNamespaceAndGPUMetrics(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("20Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"))
	for i, n := range []string{"c1", "c2", "c3"} {
		e.create(builders.MakeClaim("a", n).Memory("10Gi").Compute("10").Created(i).Obj(), builders.MakePod("a", n).Claim(n).Obj())
	}
	e.create(builders.MakeClaim("b", "c").Memory("5Gi").Compute("5").Created(0).Obj(), builders.MakePod("b", "c").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c3") != "" {
		t.Fatal("c3 placed over the 20Gi quota")
	}
	gpu := strings.TrimPrefix(e.placedOn("a", "c1"), "n1/")
	want := fmt.Sprintf(`
# HELP fgpu_allocator_gpu_fragmented_memory_bytes Free memory of a partly used GPU (no whole-GPU claim can use it); 0 on an idle GPU.
# TYPE fgpu_allocator_gpu_fragmented_memory_bytes gauge
fgpu_allocator_gpu_fragmented_memory_bytes{gpu="%[1]s",node="n1"} 5.905580032e+10
# HELP fgpu_allocator_gpu_memory_capacity_bytes GPU memory the GPU offers to claims.
# TYPE fgpu_allocator_gpu_memory_capacity_bytes gauge
fgpu_allocator_gpu_memory_capacity_bytes{gpu="%[1]s",node="n1"} 8.589934592e+10
# HELP fgpu_allocator_gpu_namespaces Namespaces with a share of the GPU.
# TYPE fgpu_allocator_gpu_namespaces gauge
fgpu_allocator_gpu_namespaces{gpu="%[1]s",node="n1"} 2
# HELP fgpu_allocator_gpu_tainted 1 while the GPU carries a taint that claims must tolerate (a fault, a degraded or flapping GPU, an admin's taint): it takes no new claims.
# TYPE fgpu_allocator_gpu_tainted gauge
fgpu_allocator_gpu_tainted{gpu="%[1]s",node="n1"} 0
# HELP fgpu_allocator_namespace_allocated_claims Allocated fgpu claims of the namespace.
# TYPE fgpu_allocator_namespace_allocated_claims gauge
fgpu_allocator_namespace_allocated_claims{namespace="a"} 2
fgpu_allocator_namespace_allocated_claims{namespace="b"} 1
# HELP fgpu_allocator_namespace_allocated_memory_bytes GPU memory allocated to the namespace's claims.
# TYPE fgpu_allocator_namespace_allocated_memory_bytes gauge
fgpu_allocator_namespace_allocated_memory_bytes{namespace="a"} 2.147483648e+10
fgpu_allocator_namespace_allocated_memory_bytes{namespace="b"} 5.36870912e+09
# HELP fgpu_allocator_namespace_allocated_compute_percent GPU compute allocated to the namespace's claims (percent of one GPU, summed).
# TYPE fgpu_allocator_namespace_allocated_compute_percent gauge
fgpu_allocator_namespace_allocated_compute_percent{namespace="a"} 20
fgpu_allocator_namespace_allocated_compute_percent{namespace="b"} 5
# HELP fgpu_allocator_namespace_pending_claims fgpu claims of the namespace a pod may use that wait for an allocation.
# TYPE fgpu_allocator_namespace_pending_claims gauge
fgpu_allocator_namespace_pending_claims{namespace="a"} 1
# HELP fgpu_allocator_namespace_oldest_pending_claim_age_seconds Age of the namespace's oldest claim waiting for an allocation.
# TYPE fgpu_allocator_namespace_oldest_pending_claim_age_seconds gauge
fgpu_allocator_namespace_oldest_pending_claim_age_seconds{namespace="a"} %[2]v
# HELP fgpu_allocator_namespace_quota_memory_bytes The namespace's GPU memory quota, and the SharingPolicy that sets it.
# TYPE fgpu_allocator_namespace_quota_memory_bytes gauge
fgpu_allocator_namespace_quota_memory_bytes{namespace="a",policy="q"} 2.147483648e+10
fgpu_allocator_namespace_quota_memory_bytes{namespace="b",policy="q"} 2.147483648e+10
# HELP fgpu_allocator_namespace_quota_used_memory_bytes GPU memory the namespace holds against its quota: its claims', the free room they keep from other namespaces on every GPU but one, and what its workloads scaled to zero keep.
# TYPE fgpu_allocator_namespace_quota_used_memory_bytes gauge
fgpu_allocator_namespace_quota_used_memory_bytes{namespace="a",policy="q"} 2.147483648e+10
fgpu_allocator_namespace_quota_used_memory_bytes{namespace="b",policy="q"} 5.36870912e+09
# HELP fgpu_allocator_namespace_claims_placed_total Claims the allocator placed, by namespace.
# TYPE fgpu_allocator_namespace_claims_placed_total counter
fgpu_allocator_namespace_claims_placed_total{namespace="a"} 2
fgpu_allocator_namespace_claims_placed_total{namespace="b"} 1
`, gpu, e.clock.Now().Sub(e.claim("a", "c3").CreationTimestamp.Time).Seconds())
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want),
		"fgpu_allocator_gpu_fragmented_memory_bytes", "fgpu_allocator_gpu_memory_capacity_bytes", "fgpu_allocator_gpu_namespaces",
		"fgpu_allocator_gpu_tainted", "fgpu_allocator_namespace_allocated_claims", "fgpu_allocator_namespace_allocated_memory_bytes",
		"fgpu_allocator_namespace_allocated_compute_percent", "fgpu_allocator_namespace_pending_claims",
		"fgpu_allocator_namespace_oldest_pending_claim_age_seconds", "fgpu_allocator_namespace_quota_memory_bytes",
		"fgpu_allocator_namespace_quota_used_memory_bytes", "fgpu_allocator_namespace_claims_placed_total"); err != nil {
		t.Error(err)
	}
	// c3 was refused for quota at least once; no other reason appears.
	if v := testutil.ToFloat64(e.c.metrics.refused.WithLabelValues("a", ReasonOverQuota)); v < 1 {
		t.Errorf("refusals of a for %s = %v, want ≥ 1", ReasonOverQuota, v)
	}
	if n := testutil.CollectAndCount(e.c.metrics.refused); n != 1 {
		t.Errorf("%d refusal series, want 1 (namespace a, %s)", n, ReasonOverQuota)
	}
	// An unknown reason cannot grow the label set.
	e.c.metrics.refusedIn("a", "SomethingNew")
	if v := testutil.ToFloat64(e.c.metrics.refused.WithLabelValues("a", "other")); v != 1 {
		t.Errorf("unknown reason counted as other %v times, want 1", v)
	}
}

// A namespace whose claims are all gone drops out of the gauges: they do not grow with
// every namespace ever seen.
func TestNamespaceGaugesDropGoneNamespaces(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "c").Claim("c").Obj())
	e.run()
	if n, _ := testutil.GatherAndCount(e.reg, "fgpu_allocator_namespace_allocated_memory_bytes"); n != 1 {
		t.Fatalf("%d series before the claim went, want 1", n)
	}
	if err := e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.run()
	if n, _ := testutil.GatherAndCount(e.reg, "fgpu_allocator_namespace_allocated_memory_bytes", "fgpu_allocator_namespace_quota_memory_bytes"); n != 0 {
		t.Errorf("%d series after the namespace's last claim went, want 0", n)
	}
}

// The quota's used gauges count what the quota check counts: a workload scaled to zero
// keeps its reserve of its namespace's quota.
func TestQuotaUsedCountsIdleReserve(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("40Gi").QuotaCompute(100).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		deployment("a", "web", 0, reserveAnnotations("30Gi", 40)),
		builders.MakeClaim("a", "c").Memory("5Gi").Compute("5").Obj(), builders.MakePod("a", "c").Claim("c").Obj())
	e.waitWorkload("a", 0)
	e.run()
	want := `
# HELP fgpu_allocator_namespace_quota_used_memory_bytes GPU memory the namespace holds against its quota: its claims', the free room they keep from other namespaces on every GPU but one, and what its workloads scaled to zero keep.
# TYPE fgpu_allocator_namespace_quota_used_memory_bytes gauge
fgpu_allocator_namespace_quota_used_memory_bytes{namespace="a",policy="q"} 3.758096384e+10
# HELP fgpu_allocator_namespace_quota_used_compute_percent GPU compute the namespace holds against its quota: its claims', the free room they keep from other namespaces on every GPU but one, and what its workloads scaled to zero keep.
# TYPE fgpu_allocator_namespace_quota_used_compute_percent gauge
fgpu_allocator_namespace_quota_used_compute_percent{namespace="a",policy="q"} 45
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want),
		"fgpu_allocator_namespace_quota_used_memory_bytes", "fgpu_allocator_namespace_quota_used_compute_percent"); err != nil {
		t.Error(err)
	}
}

// A scrape sends its per-GPU series without holding the model's lock: decisions take it,
// and a slow reader of thousands of GPUs' series must not stall them.
func TestCollectSendsWithoutTheModelLock(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"))
	e.run()
	ch := make(chan prometheus.Metric)
	done := make(chan struct{})
	go func() {
		e.c.metrics.Collect(ch)
		close(ch)
	}()
	go func() {
		defer close(done)
		for range ch {
			// The sender waits for this receive: were it holding the model's lock, the
			// transaction below would wait for ever.
			locked := make(chan struct{})
			go func() {
				e.c.model.Update(func(*model.Tx) {})
				close(locked)
			}()
			select {
			case <-locked:
			case <-time.After(5 * time.Second):
				t.Error("the model's lock is held while a metric is sent")
			}
		}
	}()
	<-done
}

// adoptionSeries are the before-and-after series, cluster-wide and per namespace.
var adoptionSeries = []string{"fgpu_allocator_sizing_gpus_held", "fgpu_allocator_sizing_gpus_needed", "fgpu_allocator_sizing_unplaced_shares",
	"fgpu_allocator_sizing_workloads", "fgpu_allocator_sizing_measured_workloads", "fgpu_allocator_sizing_recommended_workloads",
	"fgpu_allocator_sizing_gpus_held_at_most",
	"fgpu_allocator_namespace_sizing_gpus_held", "fgpu_allocator_namespace_sizing_observed_gpus_held",
	"fgpu_allocator_namespace_sizing_held_memory_bytes", "fgpu_allocator_namespace_sizing_measured_held_memory_bytes",
	"fgpu_allocator_namespace_sizing_used_memory_p95_bytes", "fgpu_allocator_namespace_sizing_needed_memory_bytes"}

// adoptionEnv: on n1's four 80Gi GPUs, team-a's Deployment web holds a 40Gi share of gpu-0
// through its claim c, measured at a p95 of 9Gi over one report (too few samples for a
// recommendation); team-b's pod legacy holds gpu-1 outside fgpu, observed using 4Gi (p95)
// over 200 samples, which gives it a recommendation.
func adoptionEnv(t *testing.T) (*env, api.SizingWorkload) {
	t.Helper()
	pod := ownedPod("team-a", "web-7c9d5-abcde", "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	claim := builders.MakeClaim("team-a", "c").Memory("40Gi").AllocatedOn("n1", "gpu-0").Obj()
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(t, claim, string(*claim.Status.Allocation.Devices.Results[0].ShareID),
		api.ShareUsage{From: builders.Created.Time, To: builders.Created.Add(5 * time.Minute), Samples: 30, MemoryMaxBytes: 10 << 30, MemoryP95Bytes: 9 << 30})}
	legacy := builders.MakePod("team-b", "legacy").Bound("n1").Obj()
	e := newEnvWith(t, func(c *Config) { c.Namespace = "fgpu-system" }, nil,
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), claim, pod, legacy,
		observedMap("fgpu-system", "n1", "n1", legacy))
	e.run()
	if ev := e.awaitEvents("Pod team-b/legacy request gpu: recommended memory", 1); len(ev) != 1 {
		t.Fatalf("no recommendation for team-b/legacy: %q", e.events(""))
	}
	return e, api.SizingWorkload{Namespace: "team-b", Kind: "Pod", Name: "legacy", Request: api.ExtendedResourceRequest}
}

// The sizing loop counts what kubectl fgpu report counts, and the metrics serve it: the GPUs
// fgpu's claims and the pods it did not place hold (2), those they would need at fgpu's sizes
// (1: web's share at what it holds, legacy's at its recommendation, packed together); per
// namespace the memory held, the p95 of what was measured and the memory at fgpu's sizes
// where a workload has a recommendation. Nothing is served before the first count.
func TestBeforeAndAfterMetrics(t *testing.T) {
	e, legacy := adoptionEnv(t)
	if n, _ := testutil.GatherAndCount(e.reg, adoptionSeries...); n != 0 {
		t.Fatalf("%d series before the sizing loop counted, want 0", n)
	}
	e.c.sizing.countAdoption(e.ctx)
	told, ok := e.c.sizing.sizer.told(e.clock.Now().Add(-24 * time.Hour))[legacy]
	if !ok {
		t.Fatal("legacy's recommendation is not among those told")
	}
	want := fmt.Sprintf(`
# HELP fgpu_allocator_sizing_gpus_held GPUs the workloads fgpu sizes hold now (fgpu's claims, and the GPU pods fgpu did not place as they ask for the extended resource), a shared or time-sliced GPU once: kubectl fgpu report's GPUs held.
# TYPE fgpu_allocator_sizing_gpus_held gauge
fgpu_allocator_sizing_gpus_held 2
# HELP fgpu_allocator_sizing_gpus_needed GPUs the same workloads would need at fgpu's recommended sizes, packed by the placement core (kubectl fgpu report's GPUs needed); absent while no workload has a recommendation.
# TYPE fgpu_allocator_sizing_gpus_needed gauge
fgpu_allocator_sizing_gpus_needed 1
# HELP fgpu_allocator_sizing_unplaced_shares Shares the packing of fgpu_allocator_sizing_gpus_needed found no room for (it leaves them out).
# TYPE fgpu_allocator_sizing_unplaced_shares gauge
fgpu_allocator_sizing_unplaced_shares 0
# HELP fgpu_allocator_sizing_workloads Workloads counted in fgpu_allocator_sizing_gpus_held.
# TYPE fgpu_allocator_sizing_workloads gauge
fgpu_allocator_sizing_workloads 2
# HELP fgpu_allocator_sizing_measured_workloads Of them, the workloads with use measured in the last 24h.
# TYPE fgpu_allocator_sizing_measured_workloads gauge
fgpu_allocator_sizing_measured_workloads 2
# HELP fgpu_allocator_sizing_recommended_workloads Of them, the workloads with a recommendation told in the last 24h (the others count at what they hold).
# TYPE fgpu_allocator_sizing_recommended_workloads gauge
fgpu_allocator_sizing_recommended_workloads 1
# HELP fgpu_allocator_namespace_sizing_gpus_held GPUs the namespace's workloads fgpu sizes hold now, a GPU once per namespace.
# TYPE fgpu_allocator_namespace_sizing_gpus_held gauge
fgpu_allocator_namespace_sizing_gpus_held{namespace="team-a"} 1
fgpu_allocator_namespace_sizing_gpus_held{namespace="team-b"} 1
# HELP fgpu_allocator_namespace_sizing_observed_gpus_held Of them, the GPUs its pods fgpu did not place hold (NVIDIA's device plugin's, as they ask for them).
# TYPE fgpu_allocator_namespace_sizing_observed_gpus_held gauge
fgpu_allocator_namespace_sizing_observed_gpus_held{namespace="team-a"} 0
fgpu_allocator_namespace_sizing_observed_gpus_held{namespace="team-b"} 1
# HELP fgpu_allocator_namespace_sizing_held_memory_bytes GPU memory the namespace's workloads fgpu sizes hold now, each GPU's once (a whole GPU, or one held outside fgpu, all of its memory).
# TYPE fgpu_allocator_namespace_sizing_held_memory_bytes gauge
fgpu_allocator_namespace_sizing_held_memory_bytes{namespace="team-a"} %[1]v
fgpu_allocator_namespace_sizing_held_memory_bytes{namespace="team-b"} %[2]v
# HELP fgpu_allocator_namespace_sizing_measured_held_memory_bytes Of it, what the shares with use measured in the last 24h hold; absent where none was measured.
# TYPE fgpu_allocator_namespace_sizing_measured_held_memory_bytes gauge
fgpu_allocator_namespace_sizing_measured_held_memory_bytes{namespace="team-a"} %[1]v
fgpu_allocator_namespace_sizing_measured_held_memory_bytes{namespace="team-b"} %[2]v
# HELP fgpu_allocator_namespace_sizing_used_memory_p95_bytes The 95th percentile of the memory those measured shares used, summed over them; absent where none was measured.
# TYPE fgpu_allocator_namespace_sizing_used_memory_p95_bytes gauge
fgpu_allocator_namespace_sizing_used_memory_p95_bytes{namespace="team-a"} %[3]v
fgpu_allocator_namespace_sizing_used_memory_p95_bytes{namespace="team-b"} %[4]v
# HELP fgpu_allocator_namespace_sizing_needed_memory_bytes GPU memory the namespace's workloads would hold at fgpu's recommended sizes (what they hold where a workload has no recommendation or keeps its GPUs whole); absent while none of them has a recommendation.
# TYPE fgpu_allocator_namespace_sizing_needed_memory_bytes gauge
fgpu_allocator_namespace_sizing_needed_memory_bytes{namespace="team-b"} %[5]v
`, float64(40<<30), float64(80<<30), float64(9<<30), float64(4<<30), float64(told.rec.MemoryBytes))
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), adoptionSeries...); err != nil {
		t.Error(err)
	}
	if told.rec.MemoryBytes <= 0 || told.rec.MemoryBytes >= 80<<30 {
		t.Errorf("legacy recommended %d bytes: want a share of its GPU", told.rec.MemoryBytes)
	}
}

// A namespace whose last sized share went drops out at the next count; the cluster's GPUs
// held stay, at 0, and the GPUs needed go with the last recommendation.
func TestBeforeAndAfterNamespacesDropOut(t *testing.T) {
	e, _ := adoptionEnv(t)
	e.c.sizing.countAdoption(e.ctx)
	if err := e.client.CoreV1().Pods("team-b").Delete(e.ctx, "legacy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
	e.c.sizing.countAdoption(e.ctx)
	if n, _ := testutil.GatherAndCount(e.reg, "fgpu_allocator_namespace_sizing_held_memory_bytes"); n != 1 {
		t.Errorf("%d namespaces after team-b's pod went, want 1 (team-a)", n)
	}
	if n, _ := testutil.GatherAndCount(e.reg, "fgpu_allocator_sizing_gpus_needed"); n != 0 {
		t.Errorf("GPUs needed served without a recommendation")
	}
	if err := e.client.ResourceV1().ResourceClaims("team-a").Delete(e.ctx, "c", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
	e.c.sizing.countAdoption(e.ctx)
	want := `
# HELP fgpu_allocator_sizing_gpus_held GPUs the workloads fgpu sizes hold now (fgpu's claims, and the GPU pods fgpu did not place as they ask for the extended resource), a shared or time-sliced GPU once: kubectl fgpu report's GPUs held.
# TYPE fgpu_allocator_sizing_gpus_held gauge
fgpu_allocator_sizing_gpus_held 0
# HELP fgpu_allocator_sizing_workloads Workloads counted in fgpu_allocator_sizing_gpus_held.
# TYPE fgpu_allocator_sizing_workloads gauge
fgpu_allocator_sizing_workloads 0
`
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), adoptionSeries[:4]...); err != nil {
		t.Error(err)
	}
	if n, _ := testutil.GatherAndCount(e.reg, adoptionSeries[7:]...); n != 0 {
		t.Errorf("%d per-namespace series with nothing held, want 0", n)
	}
}

// The sizing series count the GPU pods fgpu did not place as kubectl fgpu report does: from
// the nvidia.com/gpu they ask for, on a node whose device plugin time-slices each of its two
// GPUs as 4 units. a and b, seen on gpu-1, hold it once (80Gi); the idle notebook, seen on
// none, is put on gpu-1's spare units, and the most they may hold (2) is served beside.
func TestBeforeAndAfterCountsWhatPodsOutsideFgpuAskFor(t *testing.T) {
	asking := func(p *corev1.Pod) *corev1.Pod {
		p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{adoption.DefaultExtendedResource: resource.MustParse("1")}
		return p
	}
	a := asking(builders.MakePod("team-b", "a").Bound("n1").Obj())
	b := asking(builders.MakePod("team-b", "b").Bound("n1").Obj())
	idle := asking(builders.MakePod("team-b", "notebook").Bound("n1").Obj())
	node := builders.MakeNode("n1").Obj()
	node.Status.Allocatable[adoption.DefaultExtendedResource] = resource.MustParse("8")
	e := newEnvWith(t, func(c *Config) { c.Namespace = "fgpu-system" }, nil,
		node, builders.MakeSlice("n1", 2, "80Gi"), a, b, idle, observedMap("fgpu-system", "n1", "n1", a, b))
	e.run()
	e.c.sizing.countAdoption(e.ctx)
	want := fmt.Sprintf(`
# HELP fgpu_allocator_sizing_gpus_held GPUs the workloads fgpu sizes hold now (fgpu's claims, and the GPU pods fgpu did not place as they ask for the extended resource), a shared or time-sliced GPU once: kubectl fgpu report's GPUs held.
# TYPE fgpu_allocator_sizing_gpus_held gauge
fgpu_allocator_sizing_gpus_held 1
# HELP fgpu_allocator_sizing_gpus_held_at_most The most GPUs those workloads may hold, where more than fgpu_allocator_sizing_gpus_held: time-sliced pods that ran nothing seen are counted there on the fewest GPUs they fit; absent otherwise.
# TYPE fgpu_allocator_sizing_gpus_held_at_most gauge
fgpu_allocator_sizing_gpus_held_at_most 2
# HELP fgpu_allocator_sizing_workloads Workloads counted in fgpu_allocator_sizing_gpus_held.
# TYPE fgpu_allocator_sizing_workloads gauge
fgpu_allocator_sizing_workloads 3
# HELP fgpu_allocator_namespace_sizing_observed_gpus_held Of them, the GPUs its pods fgpu did not place hold (NVIDIA's device plugin's, as they ask for them).
# TYPE fgpu_allocator_namespace_sizing_observed_gpus_held gauge
fgpu_allocator_namespace_sizing_observed_gpus_held{namespace="team-b"} 1
# HELP fgpu_allocator_namespace_sizing_held_memory_bytes GPU memory the namespace's workloads fgpu sizes hold now, each GPU's once (a whole GPU, or one held outside fgpu, all of its memory).
# TYPE fgpu_allocator_namespace_sizing_held_memory_bytes gauge
fgpu_allocator_namespace_sizing_held_memory_bytes{namespace="team-b"} %v
`, float64(80<<30))
	if err := testutil.GatherAndCompare(e.reg, strings.NewReader(want), "fgpu_allocator_sizing_gpus_held", "fgpu_allocator_sizing_gpus_held_at_most",
		"fgpu_allocator_sizing_workloads", "fgpu_allocator_namespace_sizing_observed_gpus_held", "fgpu_allocator_namespace_sizing_held_memory_bytes"); err != nil {
		t.Error(err)
	}
}
