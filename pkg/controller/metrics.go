package controller

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// Metrics are the allocator's Prometheus metrics. Per-GPU and per-namespace figures are read
// from the allocator's own state at scrape time (no API calls), so decisions pay nothing for
// them; the before and after of sizing (adoption.go) is counted by the sizing loop and read
// at scrape time. Label cardinality: node and gpu are bounded by the published GPUs;
// namespace by the namespaces that hold or wait for fgpu claims, that a SharingPolicy's quota
// selects, or whose GPU pods outside fgpu the kubelet plugins measured (the counters: that
// placed or refused claims since the allocator started); policy by the
// SharingPolicies; reason by the fixed set refusalReasons, or resizeWant.reason's five.
type Metrics struct {
	decision prometheus.Histogram
	latency  prometheus.Histogram
	placed   prometheus.Counter
	writes   *prometheus.CounterVec
	nsPlaced *prometheus.CounterVec
	refused  *prometheus.CounterVec
	evicted  *prometheus.CounterVec
	// preempted counts pods deleted to take back GPUs held beyond quota (reclaim.go).
	preempted *prometheus.CounterVec
	ctrl      *Controller

	pendingDesc, memDesc, compDesc, tenantsDesc, fragDesc                    *prometheus.Desc
	memCapDesc, compCapDesc, gpuNsDesc, gpuFragDesc, gpuTaintedDesc          *prometheus.Desc
	nsClaimsDesc, nsMemDesc, nsCompDesc, nsPendingDesc, nsOldestDesc         *prometheus.Desc
	nsQuotaMemDesc, nsQuotaMemUsedDesc, nsQuotaCompDesc, nsQuotaCompUsedDesc *prometheus.Desc
	adoption                                                                 adoptionMetrics
}

// refusalReasons are the reasons fgpu_allocator_namespace_claims_refused_total counts by:
// the event reasons of a claim that waits. Any other counts as "other", so the set stays fixed.
var refusalReasons = map[string]bool{ReasonWaiting: true, ReasonOverQuota: true, ReasonQuotaQueued: true,
	ReasonUnsupported: true, ReasonInvalidPolicy: true, ReasonPodBoundElsewhere: true}

// NewMetrics registers the metrics with reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	gpuLabels, nsLabels, quotaLabels := []string{"node", "gpu"}, []string{"namespace"}, []string{"namespace", "policy"}
	m := &Metrics{
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fgpu_allocator_decision_seconds",
			Help: "Time to decide where one claim goes.", Buckets: prometheus.ExponentialBuckets(50e-6, 2, 16)}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fgpu_allocator_claim_allocation_latency_seconds",
			Help: "From a claim's creation to its allocation.", Buckets: prometheus.ExponentialBuckets(1e-3, 2, 18)}),
		placed: prometheus.NewCounter(prometheus.CounterOpts{Name: "fgpu_allocator_claims_placed_total", Help: "Claims the allocator placed."}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_api_writes_total",
			Help: "Requests that write to the API server (events included), by verb and resource[/subresource]: over fgpu_allocator_claims_placed_total, the writes per placed claim."},
			[]string{"verb", "resource"}),
		nsPlaced: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_namespace_claims_placed_total",
			Help: "Claims the allocator placed, by namespace."}, nsLabels),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_namespace_claims_refused_total",
			Help: "Decisions that left a claim waiting, by namespace and reason (the claim's event reason; a claim that waits long is decided on again and counted again)."},
			[]string{"namespace", "reason"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_sizing_evictions_total",
			Help: "Pods sizing Auto evicted so that their controllers recreate them, by namespace and reason: grow (use near the cap), shrink (far below it), burst (its workload is measured and its pods may burst), relieve (its GPU's tenants together near its memory), consolidate (its GPU is emptied)."},
			[]string{"namespace", "reason"}),
		preempted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fgpu_allocator_preempted_pods_total",
			Help: "Pods the allocator deleted to take back a GPU that only namespaces granted allowSharedGPU used, beyond what their quotas pay for, for another namespace's waiting claim; by the pods' namespace."},
			nsLabels),
		pendingDesc: prometheus.NewDesc("fgpu_allocator_pending_claims", "fgpu claims a pod may use that wait for an allocation.", nil, nil),
		memDesc:     prometheus.NewDesc("fgpu_allocator_gpu_allocated_memory_bytes", "GPU memory allocated to claims.", gpuLabels, nil),
		compDesc:    prometheus.NewDesc("fgpu_allocator_gpu_allocated_compute_percent", "GPU compute allocated to claims.", gpuLabels, nil),
		tenantsDesc: prometheus.NewDesc("fgpu_allocator_gpu_tenants", "Claims sharing the GPU.", gpuLabels, nil),
		fragDesc: prometheus.NewDesc("fgpu_allocator_fragmentation_ratio",
			"Share of the free GPU memory that sits on partly used GPUs (free memory no whole-GPU claim can use).", nil, nil),
		memCapDesc:  prometheus.NewDesc("fgpu_allocator_gpu_memory_capacity_bytes", "GPU memory the GPU offers to claims.", gpuLabels, nil),
		compCapDesc: prometheus.NewDesc("fgpu_allocator_gpu_compute_capacity_percent", "GPU compute the GPU offers to claims.", gpuLabels, nil),
		gpuNsDesc:   prometheus.NewDesc("fgpu_allocator_gpu_namespaces", "Namespaces with a share of the GPU.", gpuLabels, nil),
		gpuFragDesc: prometheus.NewDesc("fgpu_allocator_gpu_fragmented_memory_bytes",
			"Free memory of a partly used GPU (no whole-GPU claim can use it); 0 on an idle GPU.", gpuLabels, nil),
		gpuTaintedDesc: prometheus.NewDesc("fgpu_allocator_gpu_tainted",
			"1 while the GPU carries a taint that claims must tolerate (a fault, a degraded or flapping GPU, an admin's taint): it takes no new claims.", gpuLabels, nil),
		nsClaimsDesc:  prometheus.NewDesc("fgpu_allocator_namespace_allocated_claims", "Allocated fgpu claims of the namespace.", nsLabels, nil),
		nsMemDesc:     prometheus.NewDesc("fgpu_allocator_namespace_allocated_memory_bytes", "GPU memory allocated to the namespace's claims.", nsLabels, nil),
		nsCompDesc:    prometheus.NewDesc("fgpu_allocator_namespace_allocated_compute_percent", "GPU compute allocated to the namespace's claims (percent of one GPU, summed).", nsLabels, nil),
		nsPendingDesc: prometheus.NewDesc("fgpu_allocator_namespace_pending_claims", "fgpu claims of the namespace a pod may use that wait for an allocation.", nsLabels, nil),
		nsOldestDesc:  prometheus.NewDesc("fgpu_allocator_namespace_oldest_pending_claim_age_seconds", "Age of the namespace's oldest claim waiting for an allocation.", nsLabels, nil),
		nsQuotaMemDesc: prometheus.NewDesc("fgpu_allocator_namespace_quota_memory_bytes",
			"The namespace's GPU memory quota, and the SharingPolicy that sets it.", quotaLabels, nil),
		nsQuotaMemUsedDesc: prometheus.NewDesc("fgpu_allocator_namespace_quota_used_memory_bytes",
			"GPU memory the namespace holds against its quota: its claims', the free room they keep from other namespaces on every GPU but one, and what its workloads scaled to zero keep.", quotaLabels, nil),
		nsQuotaCompDesc: prometheus.NewDesc("fgpu_allocator_namespace_quota_compute_percent",
			"The namespace's GPU compute quota, and the SharingPolicy that sets it.", quotaLabels, nil),
		nsQuotaCompUsedDesc: prometheus.NewDesc("fgpu_allocator_namespace_quota_used_compute_percent",
			"GPU compute the namespace holds against its quota: its claims', the free room they keep from other namespaces on every GPU but one, and what its workloads scaled to zero keep.", quotaLabels, nil),
		adoption: newAdoptionMetrics(),
	}
	if reg != nil {
		reg.MustRegister(m.decision, m.latency, m.placed, m.writes, m.nsPlaced, m.refused, m.evicted, m.preempted, m)
	}
	return m
}

// placedIn counts a placed claim of namespace ns.
func (m *Metrics) placedIn(ns string) {
	m.placed.Inc()
	m.nsPlaced.WithLabelValues(ns).Inc()
}

// refusedIn counts a decision that left a claim of namespace ns waiting for reason.
func (m *Metrics) refusedIn(ns, reason string) {
	if !refusalReasons[reason] {
		reason = "other"
	}
	m.refused.WithLabelValues(ns, reason).Inc()
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.pendingDesc, m.memDesc, m.compDesc, m.tenantsDesc, m.fragDesc,
		m.memCapDesc, m.compCapDesc, m.gpuNsDesc, m.gpuFragDesc, m.gpuTaintedDesc,
		m.nsClaimsDesc, m.nsMemDesc, m.nsCompDesc, m.nsPendingDesc, m.nsOldestDesc,
		m.nsQuotaMemDesc, m.nsQuotaMemUsedDesc, m.nsQuotaCompDesc, m.nsQuotaCompUsedDesc} {
		ch <- d
	}
	m.adoption.describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	c := m.ctrl
	if c == nil {
		return
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(m.pendingDesc, float64(c.pending.Len()))
	// The figures are copied under the model's lock and sent after it: a scrape of
	// thousands of GPUs must not hold decisions while the registry reads the channel.
	type gpuFigures struct {
		node, device                       string
		usedMem, usedComp, memCap, compCap int64
		tenants, namespaces                int
		tainted                            bool
	}
	var figs []gpuFigures
	c.model.EachGPU(func(g *model.GPU) {
		namespaces := map[string]struct{}{}
		for t := range g.Tenants() {
			namespaces[t.Namespace] = struct{}{}
		}
		figs = append(figs, gpuFigures{node: g.Node(), device: g.Key().Device, usedMem: g.UsedMem(), usedComp: g.UsedComp(),
			memCap: g.MemCap(), compCap: g.CompCap(), tenants: g.NumTenants(), namespaces: len(namespaces), tainted: len(g.Taints()) > 0})
	})
	var free, partFree float64
	for _, g := range figs {
		gauge(m.memDesc, float64(g.usedMem), g.node, g.device)
		gauge(m.compDesc, float64(g.usedComp), g.node, g.device)
		gauge(m.tenantsDesc, float64(g.tenants), g.node, g.device)
		gauge(m.memCapDesc, float64(g.memCap), g.node, g.device)
		gauge(m.compCapDesc, float64(g.compCap), g.node, g.device)
		gauge(m.gpuNsDesc, float64(g.namespaces), g.node, g.device)
		f := float64(g.memCap - g.usedMem)
		free += f
		frag := 0.0
		if g.tenants > 0 {
			partFree += f
			frag = f
		}
		gauge(m.gpuFragDesc, frag, g.node, g.device)
		gauge(m.gpuTaintedDesc, boolValue(g.tainted), g.node, g.device)
	}
	frag := 0.0
	if free > 0 {
		frag = partFree / free
	}
	gauge(m.fragDesc, frag)
	m.collectNamespaces(c, gauge)
	m.adoption.collect(c.sizing.adoption.get(), gauge)
}

// collectNamespaces reports the namespaces that hold or wait for claims, and their quotas
// with those of the namespaces a quota selects.
func (m *Metrics) collectNamespaces(c *Controller, gauge func(*prometheus.Desc, float64, ...string)) {
	use := c.model.ByNamespace()
	reserve := c.model.Reserves()
	pending := c.pending.ByNamespace()
	now := c.now()
	known := map[string]struct{}{}
	for ns, u := range use {
		known[ns] = struct{}{}
		gauge(m.nsClaimsDesc, float64(u.Claims), ns)
		gauge(m.nsMemDesc, float64(u.Mem), ns)
		gauge(m.nsCompDesc, float64(u.Comp), ns)
	}
	for ns, p := range pending {
		known[ns] = struct{}{}
		gauge(m.nsPendingDesc, float64(p.Claims), ns)
		gauge(m.nsOldestDesc, max(now.Sub(p.Oldest).Seconds(), 0), ns)
	}
	policies := c.policyList()
	if !slices.ContainsFunc(policies, func(p *api.SharingPolicy) bool { return p.Spec.Quota != nil }) {
		return
	}
	nsLabels := map[string]map[string]string{}
	if c.namespaces != nil {
		if list, err := c.namespaces.List(labels.Everything()); err == nil {
			for _, n := range list {
				nsLabels[n.Name] = n.Labels
				known[n.Name] = struct{}{}
			}
		}
	}
	for ns := range known {
		q := policy.NamespaceQuota(policies, nsLabels[ns])
		// What the quota check counts: the claims, the room they keep from other namespaces,
		// and the reserves of workloads scaled to zero.
		u, r := use[ns], reserve[ns]
		if q.Memory != nil {
			gauge(m.nsQuotaMemDesc, float64(q.Memory.Value()), ns, q.MemoryFrom)
			gauge(m.nsQuotaMemUsedDesc, float64(addSat(u.Charged, r.Mem)), ns, q.MemoryFrom)
		}
		if q.Compute != nil {
			gauge(m.nsQuotaCompDesc, float64(*q.Compute), ns, q.ComputeFrom)
			gauge(m.nsQuotaCompUsedDesc, float64(addSat(u.ChargedComp, r.Comp)), ns, q.ComputeFrom)
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
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
