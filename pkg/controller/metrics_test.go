package controller

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
			if !e.c.model.mu.TryLock() {
				t.Error("the model's lock is held while a metric is sent")
				continue
			}
			e.c.model.mu.Unlock()
		}
	}()
	<-done
}
