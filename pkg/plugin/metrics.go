package plugin

import (
	"cmp"
	"maps"
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// Metrics are the plugin's Prometheus series. Label cardinality: gpu and uuid are bounded by
// the node's GPUs, condition by the three health taints; namespace and claim by the claims
// prepared on the node, at most maxClaimSeries of them (the first by namespace and name; the
// others are counted in fgpu_claim_series_omitted).
type Metrics struct {
	prepareSeconds *prometheus.HistogramVec
	allocatedBytes *prometheus.GaugeVec
	allocatedPct   *prometheus.GaugeVec
	tenants        *prometheus.GaugeVec
	capacityBytes  *prometheus.GaugeVec
	claimMemory    *prometheus.GaugeVec
	claimGuarantee *prometheus.GaugeVec
	claimUsed      *prometheus.GaugeVec
	claimSM        *prometheus.GaugeVec
	claimCompute   *prometheus.GaugeVec
	omitted        prometheus.Gauge
	healthy        *prometheus.GaugeVec
	condition      *prometheus.GaugeVec
}

// maxClaimSeries bounds the per-claim series of one node: far more claims than a node's GPUs
// hold in practice, few enough that a runaway cannot swamp Prometheus.
const maxClaimSeries = 512

// healthConditions are the health taints fgpu_gpu_condition reports, by their label value.
var healthConditions = map[string]string{configapi.FaultTaintKey: "fault", configapi.DegradedTaintKey: "degraded", configapi.FlappingTaintKey: "flapping"}

// NewMetrics registers the plugin's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		prepareSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "fgpu_prepare_duration_seconds", Help: "Time to prepare one claim in NodePrepareResources.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"result"}),
		allocatedBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_prepared_memory_bytes", Help: "Memory of the claims prepared on a GPU."}, []string{"gpu", "uuid"}),
		allocatedPct:   prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_prepared_compute_percent", Help: "Compute reserved by the claims prepared on a GPU."}, []string{"gpu", "uuid"}),
		tenants:        prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_tenants", Help: "Claims prepared on a GPU."}, []string{"gpu", "uuid"}),
		capacityBytes:  prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_allocatable_memory_bytes", Help: "Memory a GPU offers to claims."}, []string{"gpu", "uuid"}),
		claimMemory:    prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_memory_limit_bytes", Help: "Memory cap of a prepared claim."}, []string{"namespace", "claim", "gpu"}),
		claimGuarantee: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_memory_guaranteed_bytes",
			Help: "Memory allocated to a prepared claim (what packing and quota count); a burst share's cap is above it."}, []string{"namespace", "claim", "gpu"}),
		claimUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_memory_used_bytes",
			Help: "GPU memory the processes of a prepared claim held at the last measurement."}, []string{"namespace", "claim", "gpu"}),
		claimSM: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_sm_active_percent",
			Help: "SM activity of the processes of a prepared claim over the last measurement (absent where the driver gave no sample)."}, []string{"namespace", "claim", "gpu"}),
		claimCompute: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_compute_limit_percent",
			Help: "Active-thread cap (percent of the GPU's SMs) of a prepared claim; 0: uncapped."}, []string{"namespace", "claim", "gpu"}),
		omitted: prometheus.NewGauge(prometheus.GaugeOpts{Name: "fgpu_claim_series_omitted",
			Help: "Prepared claims of this node left out of the per-claim series (more than 512)."}),
		healthy: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_healthy",
			Help: "1 while the GPU has no health taint (fault, degraded, flapping), else 0."}, []string{"gpu", "uuid"}),
		condition: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_gpu_condition",
			Help: "1 while the GPU carries the health taint of the condition (fault: NoExecute; degraded, flapping: NoSchedule)."}, []string{"gpu", "uuid", "condition"}),
	}
	reg.MustRegister(m.prepareSeconds, m.allocatedBytes, m.allocatedPct, m.tenants, m.capacityBytes, m.claimMemory, m.claimGuarantee, m.claimUsed, m.claimSM,
		m.claimCompute, m.omitted, m.healthy, m.condition)
	return m
}

func (m *Metrics) observePrepare(d time.Duration, err error) {
	if m == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.prepareSeconds.WithLabelValues(result).Observe(d.Seconds())
}

// observeState recomputes the per-GPU gauges from the prepared claims.
func (m *Metrics) observeState(s *State) {
	if m == nil {
		return
	}
	m.claimMemory.Reset()
	m.claimGuarantee.Reset()
	m.claimCompute.Reset()
	type sums struct{ mem, pct, n int64 }
	per := map[string]*sums{}
	claims := s.PreparedClaims()
	shown := m.shownClaims(claims)
	for uid, e := range claims {
		for _, p := range e.Devices {
			if per[p.Device] == nil {
				per[p.Device] = &sums{}
			}
			per[p.Device].mem += p.MemoryBytes
			per[p.Device].pct += p.ComputePercent
			per[p.Device].n++
			if shown[uid] {
				m.claimMemory.WithLabelValues(e.Namespace, e.Name, p.Device).Set(float64(p.MemoryLimitBytes))
				m.claimGuarantee.WithLabelValues(e.Namespace, e.Name, p.Device).Set(float64(p.MemoryBytes))
				m.claimCompute.WithLabelValues(e.Namespace, e.Name, p.Device).Set(float64(p.ThreadPercent))
			}
		}
	}
	for _, d := range s.Devices() {
		v := per[d.Name()]
		if v == nil {
			v = &sums{}
		}
		m.allocatedBytes.WithLabelValues(d.Name(), d.UUID).Set(float64(v.mem))
		m.allocatedPct.WithLabelValues(d.Name(), d.UUID).Set(float64(v.pct))
		m.tenants.WithLabelValues(d.Name(), d.UUID).Set(float64(v.n))
		m.capacityBytes.WithLabelValues(d.Name(), d.UUID).Set(float64(AllocatableMemory(d, s.cfg.ReservedMemory)))
	}
}

// observeUsage sets the per-claim use gauges from the newest samples; claims gone drop out.
func (m *Metrics) observeUsage(claims map[string]checkpoint.ClaimEntry, latest map[shareKey]sizing.Sample) {
	if m == nil {
		return
	}
	m.claimUsed.Reset()
	m.claimSM.Reset()
	shown := m.shownClaims(claims)
	for k, s := range latest {
		e, ok := claims[k.claimUID]
		if !ok || !shown[k.claimUID] {
			continue
		}
		// A claim's shares of several requests on one GPU add up, as its cap does.
		m.claimUsed.WithLabelValues(e.Namespace, e.Name, k.device).Add(float64(s.MemoryBytes))
		if s.SMPercent >= 0 {
			m.claimSM.WithLabelValues(e.Namespace, e.Name, k.device).Add(float64(s.SMPercent))
		}
	}
}

// shownClaims picks the claims (by UID) that get per-claim series: all of them up to
// maxClaimSeries, else the first by namespace and name; it sets fgpu_claim_series_omitted.
func (m *Metrics) shownClaims(claims map[string]checkpoint.ClaimEntry) map[string]bool {
	uids := slices.Collect(maps.Keys(claims))
	if len(uids) > maxClaimSeries {
		slices.SortFunc(uids, func(a, b string) int {
			return cmp.Or(cmp.Compare(claims[a].Namespace, claims[b].Namespace), cmp.Compare(claims[a].Name, claims[b].Name), cmp.Compare(a, b))
		})
		m.omitted.Set(float64(len(uids) - maxClaimSeries))
		uids = uids[:maxClaimSeries]
	} else {
		m.omitted.Set(0)
	}
	shown := make(map[string]bool, len(uids))
	for _, u := range uids {
		shown[u] = true
	}
	return shown
}

// observeHealth sets each GPU's health gauges from its taints.
func (m *Metrics) observeHealth(devs []gpu.Device, taints func(uuid string) []resourceapi.DeviceTaint) {
	if m == nil {
		return
	}
	for _, d := range devs {
		on := map[string]bool{}
		for _, t := range taints(d.UUID) {
			if c, ok := healthConditions[t.Key]; ok {
				on[c] = true
			}
		}
		healthy := 1.0
		if len(on) > 0 {
			healthy = 0
		}
		m.healthy.WithLabelValues(d.Name(), d.UUID).Set(healthy)
		for _, c := range healthConditions {
			v := 0.0
			if on[c] {
				v = 1
			}
			m.condition.WithLabelValues(d.Name(), d.UUID, c).Set(v)
		}
	}
}
