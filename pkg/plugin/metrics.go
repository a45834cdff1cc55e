package plugin

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// Metrics are the plugin's Prometheus series.
type Metrics struct {
	prepareSeconds *prometheus.HistogramVec
	allocatedBytes *prometheus.GaugeVec
	allocatedPct   *prometheus.GaugeVec
	tenants        *prometheus.GaugeVec
	capacityBytes  *prometheus.GaugeVec
	claimMemory    *prometheus.GaugeVec
	claimUsed      *prometheus.GaugeVec
	claimSM        *prometheus.GaugeVec
}

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
		claimUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_memory_used_bytes",
			Help: "GPU memory the processes of a prepared claim held at the last measurement."}, []string{"namespace", "claim", "gpu"}),
		claimSM: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fgpu_claim_sm_active_percent",
			Help: "SM activity of the processes of a prepared claim over the last measurement (absent where the driver gave no sample)."}, []string{"namespace", "claim", "gpu"}),
	}
	reg.MustRegister(m.prepareSeconds, m.allocatedBytes, m.allocatedPct, m.tenants, m.capacityBytes, m.claimMemory, m.claimUsed, m.claimSM)
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
	type sums struct{ mem, pct, n int64 }
	per := map[string]*sums{}
	for _, e := range s.PreparedClaims() {
		for _, p := range e.Devices {
			if per[p.Device] == nil {
				per[p.Device] = &sums{}
			}
			per[p.Device].mem += p.MemoryBytes
			per[p.Device].pct += p.ComputePercent
			per[p.Device].n++
			m.claimMemory.WithLabelValues(e.Namespace, e.Name, p.Device).Set(float64(p.MemoryLimitBytes))
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
	for k, s := range latest {
		e, ok := claims[k.claimUID]
		if !ok {
			continue
		}
		// A claim's shares of several requests on one GPU add up, as its cap does.
		m.claimUsed.WithLabelValues(e.Namespace, e.Name, k.device).Add(float64(s.MemoryBytes))
		if s.SMPercent >= 0 {
			m.claimSM.WithLabelValues(e.Namespace, e.Name, k.device).Add(float64(s.SMPercent))
		}
	}
}
