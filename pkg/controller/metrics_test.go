package controller

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
