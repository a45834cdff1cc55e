package controller

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// adoptionInterval is how often the sizing loop counts the before and after of sizing for
// the metrics (or each usage report interval, where that is shorter): the packing it runs
// is too much work for every scrape, and its inputs move at most once a report interval per
// share, except placements.
const adoptionInterval = time.Minute

// beforeAfter holds the before and after of sizing (pkg/adoption) the sizing loop counted
// last, for the metrics to read at scrape time; nil until it has counted once.
type beforeAfter struct {
	mu  sync.Mutex
	sum *adoption.Summary
}

func (b *beforeAfter) get() *adoption.Summary {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sum
}

// countAdoption counts what `kubectl fgpu report` counts over every namespace with its
// default window (adoption.Window), with the same code: the GPUs fgpu publishes, its claims'
// shares and the GPU pods fgpu did not place, counted from the extended resource they ask
// for (cfg.ExtendedResource), each GPU once where the node's device plugin time-slices it
// (its allocatable count), with what the kubelet plugins measured of them (observe mode);
// at the recommendations this allocator last told (which the report reads from their
// events). It reads the informers' caches and the model, and makes no API call.
func (s *sizingLoop) countAdoption(ctx context.Context) {
	now := s.now()
	from := now.Add(-adoption.Window)
	var all []*adoption.GPU
	keys := map[*adoption.GPU]string{}
	s.model.EachGPU(func(g *model.GPU) {
		a := &adoption.GPU{Node: g.Key().Pool, Device: g.Key().Device, Product: model.Product(g), Memory: g.MemCap()}
		all = append(all, a)
		keys[a] = g.Key().Pool + "/" + g.Key().Device
	})
	// In name order, as the report packs them.
	sort.Slice(all, func(i, j int) bool { return keys[all[i]] < keys[all[j]] })
	gpus := make(map[string]*adoption.GPU, len(all))
	for _, g := range all {
		gpus[keys[g]] = g
	}
	pod := func(ns, name string) *corev1.Pod {
		p, err := s.pods.Pods(ns).Get(name)
		if err != nil {
			return nil
		}
		return p
	}
	claims, err := s.claims.List(labels.Everything())
	if err != nil {
		return
	}
	pods, err := s.pods.List(labels.Everything())
	if err != nil {
		return
	}
	placed := adoption.PlacedShares(claims, s.cfg.DriverName, pod, gpus, from)
	outside := adoption.Outside{FgpuNamespace: s.cfg.Namespace, Resource: corev1.ResourceName(s.cfg.ExtendedResource), Pods: pods,
		Node: func(name string) (*corev1.Node, error) { return s.nodes.Get(name) }}
	if s.observed != nil {
		outside.Maps, outside.MapsErr = s.observed.List(labels.Everything())
	}
	observed := adoption.ObservedShares(outside, all, from)
	told := s.sizer.told(from)
	sum, err := adoption.Summarize(all, placed, observed, func(w api.SizingWorkload) (api.SizingRecommendation, time.Time, bool) {
		a, ok := told[w]
		return a.rec, a.at, ok
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot count the GPUs the workloads would need at fgpu's sizes; the metrics keep the last count")
		return
	}
	s.adoption.mu.Lock()
	s.adoption.sum = sum
	s.adoption.mu.Unlock()
}

// told is the recommendations the allocator told (as FgpuSizingRecommendation events) at
// from or later, by workload.
func (z *sizer) told(from time.Time) map[api.SizingWorkload]announcement {
	out := map[api.SizingWorkload]announcement{}
	if z == nil {
		return out
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	for w, a := range z.announced {
		if !a.at.Before(from) {
			out[w] = a
		}
	}
	return out
}

// adoptionMetrics are the before and after of sizing as series: for the cluster, the GPUs the
// workloads fgpu sizes hold now and those they would need at fgpu's sizes, as `kubectl fgpu
// report` counts them; per namespace, what its workloads hold, use and would hold. Read at
// scrape time from what countAdoption counted last.
type adoptionMetrics struct {
	gpusHeld, gpusHeldAtMost, gpusNeeded, unplaced                      *prometheus.Desc
	workloads, measured, recommended                                    *prometheus.Desc
	nsGPUs, nsObservedGPUs, nsHeld, nsMeasuredHeld, nsUsedP95, nsNeeded *prometheus.Desc
}

func newAdoptionMetrics() adoptionMetrics {
	ns := []string{"namespace"}
	return adoptionMetrics{
		gpusHeld: prometheus.NewDesc("fgpu_allocator_sizing_gpus_held",
			"GPUs the workloads fgpu sizes hold now (fgpu's claims, and the GPU pods fgpu did not place as they ask for the extended resource), a shared or time-sliced GPU once: kubectl fgpu report's GPUs held.", nil, nil),
		gpusHeldAtMost: prometheus.NewDesc("fgpu_allocator_sizing_gpus_held_at_most",
			"The most GPUs those workloads may hold, where more than fgpu_allocator_sizing_gpus_held: time-sliced pods that ran nothing seen are counted there on the fewest GPUs they fit; absent otherwise.", nil, nil),
		gpusNeeded: prometheus.NewDesc("fgpu_allocator_sizing_gpus_needed",
			"GPUs the same workloads would need at fgpu's recommended sizes, packed by the placement core (kubectl fgpu report's GPUs needed); absent while no workload has a recommendation.", nil, nil),
		unplaced: prometheus.NewDesc("fgpu_allocator_sizing_unplaced_shares",
			"Shares the packing of fgpu_allocator_sizing_gpus_needed found no room for (it leaves them out).", nil, nil),
		workloads: prometheus.NewDesc("fgpu_allocator_sizing_workloads", "Workloads counted in fgpu_allocator_sizing_gpus_held.", nil, nil),
		measured: prometheus.NewDesc("fgpu_allocator_sizing_measured_workloads",
			"Of them, the workloads with use measured in the last 24h.", nil, nil),
		recommended: prometheus.NewDesc("fgpu_allocator_sizing_recommended_workloads",
			"Of them, the workloads with a recommendation told in the last 24h (the others count at what they hold).", nil, nil),
		nsGPUs: prometheus.NewDesc("fgpu_allocator_namespace_sizing_gpus_held",
			"GPUs the namespace's workloads fgpu sizes hold now, a GPU once per namespace.", ns, nil),
		nsObservedGPUs: prometheus.NewDesc("fgpu_allocator_namespace_sizing_observed_gpus_held",
			"Of them, the GPUs its pods fgpu did not place hold (NVIDIA's device plugin's, as they ask for them).", ns, nil),
		nsHeld: prometheus.NewDesc("fgpu_allocator_namespace_sizing_held_memory_bytes",
			"GPU memory the namespace's workloads fgpu sizes hold now, each GPU's once (a whole GPU, or one held outside fgpu, all of its memory).", ns, nil),
		nsMeasuredHeld: prometheus.NewDesc("fgpu_allocator_namespace_sizing_measured_held_memory_bytes",
			"Of it, what the shares with use measured in the last 24h hold; absent where none was measured.", ns, nil),
		nsUsedP95: prometheus.NewDesc("fgpu_allocator_namespace_sizing_used_memory_p95_bytes",
			"The 95th percentile of the memory those measured shares used, summed over them; absent where none was measured.", ns, nil),
		nsNeeded: prometheus.NewDesc("fgpu_allocator_namespace_sizing_needed_memory_bytes",
			"GPU memory the namespace's workloads would hold at fgpu's recommended sizes (what they hold where a workload has no recommendation or keeps its GPUs whole); absent while none of them has a recommendation.", ns, nil),
	}
}

func (a *adoptionMetrics) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{a.gpusHeld, a.gpusHeldAtMost, a.gpusNeeded, a.unplaced, a.workloads, a.measured, a.recommended,
		a.nsGPUs, a.nsObservedGPUs, a.nsHeld, a.nsMeasuredHeld, a.nsUsedP95, a.nsNeeded} {
		ch <- d
	}
}

// collect sends the figures of sum; nothing before the sizing loop first counted.
func (a *adoptionMetrics) collect(sum *adoption.Summary, gauge func(*prometheus.Desc, float64, ...string)) {
	if sum == nil {
		return
	}
	gauge(a.gpusHeld, float64(sum.GPUsHeld))
	if sum.GPUsHeldAtMost != nil {
		gauge(a.gpusHeldAtMost, float64(*sum.GPUsHeldAtMost))
	}
	if sum.GPUsNeeded != nil {
		gauge(a.gpusNeeded, float64(*sum.GPUsNeeded))
		gauge(a.unplaced, float64(sum.UnplacedShares))
	}
	gauge(a.workloads, float64(len(sum.Workloads)))
	gauge(a.measured, float64(sum.MeasuredWorkloads))
	gauge(a.recommended, float64(sum.RecommendedWorkloads))
	for name, ns := range sum.Namespaces {
		gauge(a.nsGPUs, float64(ns.GPUsHeld), name)
		gauge(a.nsObservedGPUs, float64(ns.ObservedGPUsHeld), name)
		gauge(a.nsHeld, float64(ns.MemoryHeldBytes), name)
		if ns.MeasuredWorkloads > 0 {
			gauge(a.nsMeasuredHeld, float64(ns.MeasuredMemoryHeldBytes), name)
			gauge(a.nsUsedP95, float64(ns.MemoryP95Bytes), name)
		}
		if ns.RecommendedWorkloads > 0 {
			gauge(a.nsNeeded, float64(ns.MemoryNeededBytes), name)
		}
	}
}
