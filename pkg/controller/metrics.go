package controller

import (
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the allocator's Prometheus metrics. Per-GPU figures are read from the state
// at scrape time, so decisions pay nothing for them.
type Metrics struct {
	decision prometheus.Histogram
	latency  prometheus.Histogram
	placed   prometheus.Counter
	writes   *prometheus.CounterVec
	ctrl     *Controller

	pendingDesc, memDesc, compDesc, tenantsDesc, fragDesc *prometheus.Desc
}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fgpu_allocator_decision_seconds",
			Help: "Time to decide where one claim goes.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fgpu_allocator_claim_allocation_latency_seconds",
			Help: "From a claim's creation to its allocation.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 18)}),
		placed: prometheus.NewCounter(prometheus.CounterOpts{Name: "fgpu_allocator_claims_placed_total", Help: "Claims the allocator placed."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_api_writes_total",
			Help: "Requests that write to the API server (events included), by verb and resource[/subresource]: over fgpu_allocator_claims_placed_total, the writes per placed claim."},
			[]string{"verb", "resource"}),
		pendingDesc: prometheus.NewDesc("fgpu_allocator_pending_claims", "fgpu claims waiting for an allocation.", nil, nil),
		memDesc:     prometheus.NewDesc("fgpu_allocator_gpu_allocated_memory_bytes", "GPU memory allocated to claims.", []string{"node", "gpu"}, nil),
		compDesc:    prometheus.NewDesc("fgpu_allocator_gpu_allocated_compute_percent", "GPU compute allocated to claims.", []string{"node", "gpu"}, nil),
		tenantsDesc: prometheus.NewDesc("fgpu_allocator_gpu_tenants", "Claims sharing the GPU.", []string{"node", "gpu"}, nil),
		fragDesc: prometheus.NewDesc("fgpu_allocator_fragmentation_ratio",
			"Share of the free GPU memory that sits on partly used GPUs (free memory no whole-GPU claim can use).", nil, nil),
	}
	if reg != nil {
		reg.MustRegister(m.decision, m.latency, m.placed, m.writes, m)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.pendingDesc
	ch <- m.memDesc
	ch <- m.compDesc
	ch <- m.tenantsDesc
	ch <- m.fragDesc
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	c := m.ctrl
	if c == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(c.pending.Len()))
	var free, partFree float64
	c.model.EachGPU(func(g *gpu) {
		ch <- prometheus.MustNewConstMetric(m.memDesc, prometheus.GaugeValue, float64(g.usedMem), g.node, g.key.device)
		ch <- prometheus.MustNewConstMetric(m.compDesc, prometheus.GaugeValue, float64(g.usedComp), g.node, g.key.device)
		ch <- prometheus.MustNewConstMetric(m.tenantsDesc, prometheus.GaugeValue, float64(len(g.tenants)), g.node, g.key.device)
		f := float64(g.memCap - g.usedMem)
		free += f
		if len(g.tenants) > 0 {
			partFree += f
		}
	})
	frag := 0.0
	if free > 0 {
		frag = partFree / free
	}
	ch <- prometheus.MustNewConstMetric(m.fragDesc, prometheus.GaugeValue, frag)
}

// CountWrites wraps the transport of the allocator's API client: each request that writes
// is counted in fgpu_allocator_api_writes_total.
func (m *Metrics) CountWrites(rt http.RoundTripper) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if verb := writeVerbs[r.Method]; verb != "" {
			m.writes.WithLabelValues(verb, resourceOf(r.URL.Path)).Inc()
		}
		return rt.RoundTrip(r)
	})
}

var writeVerbs = map[string]string{http.MethodPost: "create", http.MethodPut: "update", http.MethodPatch: "patch", http.MethodDelete: "delete"}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// resourceOf is the resource (and subresource) an API path names:
// /apis/resource.k8s.io/v1/namespaces/a/resourceclaims/c/status is resourceclaims/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "other"
	}
	if len(parts) >= 3 && parts[0] == "namespaces" {
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "other"
	case 1, 2:
		return parts[0]
	default:
		return parts[0] + "/" + parts[2]
	}
}
