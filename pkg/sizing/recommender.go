package sizing

import (
	"math"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Options set the recommender.
type Options struct {
	// HalfLife: a sample this much older weighs half as much.
	HalfLife time.Duration
	// MemoryPercentile of the per-report memory peaks, ComputePercentile of the per-report
	// p95 SM activity, each raised by Headroom (0.15: 15 % more).
	MemoryPercentile  float64
	ComputePercentile float64
	Headroom          float64
	// MinSamples measured samples (each claim's every poll) before a recommendation is made.
	MinSamples int
}

// DefaultOptions: VPA's day-long half-life; memory near the peaks (running out of it kills
// the process), compute at the busy end; half an hour of samples at the plugin's 10 s poll
// (docs/sizing.md measures half an hour against one and three).
func DefaultOptions() Options {
	return Options{HalfLife: 24 * time.Hour, MemoryPercentile: 0.99, ComputePercentile: 0.9, Headroom: 0.15, MinSamples: 180}
}

type history struct {
	memory, compute *Histogram
	samples         int
	peak            int64
	last            time.Time // the end of the newest summary taken
}

// ForgetAfterHalfLives: a workload with no sample for this many half-lives is forgotten
// (Prune), its history then weighing 1/256 of one sample now; VPA forgets a container's
// history after 8 days at its 24 h half-life. Bare pods and Jobs of generated names are each
// a workload of their own, which no later pod reports to.
const ForgetAfterHalfLives = 8

// MaxWorkloadsPerNamespace bounds the histories kept for one namespace (each about 2 KiB):
// a new workload beyond it replaces the namespace's longest silent one. Per namespace, so
// that a tenant creating pod after pod forgets only its own workloads.
const MaxWorkloadsPerNamespace = 1000

// Recommender keeps a decaying history per workload and recommends sizes from it. It is
// not safe for concurrent use.
type Recommender struct {
	opts Options
	// workloads by namespace.
	workloads map[string]map[api.SizingWorkload]*history
	// last is each share's newest summary taken (by its end), so a summary seen twice
	// (a resync, another status write) counts once.
	last map[string]time.Time
}

// NewRecommender makes a recommender with opts.
func NewRecommender(opts Options) *Recommender {
	return &Recommender{opts: opts, workloads: map[string]map[api.SizingWorkload]*history{}, last: map[string]time.Time{}}
}

// Memory buckets from 64 MiB up to 4 TiB, 5 % apart; compute from 1 % up to 100 %.
const (
	memoryFirstBucket = 64 << 20
	memoryMax         = 4 << 40
	bucketRatio       = 1.05
)

// Add takes a share's summary for workload w; it returns false for one already taken.
func (r *Recommender) Add(w api.SizingWorkload, share string, u api.ShareUsage) bool {
	if u.Samples <= 0 || !u.To.After(r.last[share]) {
		return false
	}
	r.last[share] = u.To
	ns := r.workloads[w.Namespace]
	if ns == nil {
		ns = map[api.SizingWorkload]*history{}
		r.workloads[w.Namespace] = ns
	}
	h := ns[w]
	if h == nil {
		if len(ns) >= MaxWorkloadsPerNamespace {
			delete(ns, longestSilent(ns))
		}
		h = &history{
			memory:  NewHistogram(memoryFirstBucket, bucketRatio, memoryMax, r.opts.HalfLife),
			compute: NewHistogram(1, bucketRatio, 100, r.opts.HalfLife),
		}
		ns[w] = h
	}
	if u.To.After(h.last) {
		h.last = u.To
	}
	// A report's peak stands for its whole span, as VPA takes memory peaks per interval.
	h.memory.Add(float64(u.MemoryMaxBytes), float64(u.Samples), u.To)
	if u.SMSamples > 0 {
		h.compute.Add(float64(u.SMP95Percent), float64(u.SMSamples), u.To)
	}
	h.samples += u.Samples
	h.peak = max(h.peak, u.MemoryMaxBytes)
	return true
}

// longestSilent is the workload of ns whose newest sample is the oldest.
func longestSilent(ns map[api.SizingWorkload]*history) api.SizingWorkload {
	var oldest api.SizingWorkload
	var at time.Time
	first := true
	for w, h := range ns {
		if first || h.last.Before(at) {
			oldest, at, first = w, h.last, false
		}
	}
	return oldest
}

// Forget drops what is kept of a share that is gone (its workload's history stays).
func (r *Recommender) Forget(share string) { delete(r.last, share) }

// Prune forgets the workloads, and the shares, with no sample for ForgetAfterHalfLives
// half-lives before now.
func (r *Recommender) Prune(now time.Time) {
	cutoff := now.Add(-ForgetAfterHalfLives * r.opts.HalfLife)
	for name, ns := range r.workloads {
		for w, h := range ns {
			if h.last.Before(cutoff) {
				delete(ns, w)
			}
		}
		if len(ns) == 0 {
			delete(r.workloads, name)
		}
	}
	for share, at := range r.last {
		if at.Before(cutoff) {
			delete(r.last, share)
		}
	}
}

// Has says whether w has a history.
func (r *Recommender) Has(w api.SizingWorkload) bool { return r.workloads[w.Namespace][w] != nil }

// Recommend gives w's recommendation, or false while it rests on fewer than MinSamples.
func (r *Recommender) Recommend(w api.SizingWorkload) (api.SizingRecommendation, bool) {
	h := r.workloads[w.Namespace][w]
	if h == nil || h.samples < r.opts.MinSamples {
		return api.SizingRecommendation{}, false
	}
	mem := h.memory.Percentile(r.opts.MemoryPercentile) * (1 + r.opts.Headroom)
	step := float64(MemoryStep)
	rec := api.SizingRecommendation{
		MemoryBytes: int64(math.Ceil(mem/step) * step),
		Samples:     h.samples, PeakBytes: h.peak,
		TypicalBytes:   int64(math.Ceil(h.memory.Percentile(0.5)/step) * step),
		ComputePercent: 100,
	}
	if !h.compute.Empty() {
		rec.ComputePercent = min(100, max(1, int(math.Ceil(h.compute.Percentile(r.opts.ComputePercentile)*(1+r.opts.Headroom)))))
	}
	return rec, true
}

// Workloads lists the workloads with a history.
func (r *Recommender) Workloads() []api.SizingWorkload {
	var out []api.SizingWorkload
	for _, ns := range r.workloads {
		for w := range ns {
			out = append(out, w)
		}
	}
	return out
}

// MemoryStep is the granularity of memory shares (api's MemoryStep, not imported so that
// this package stays free of Kubernetes types).
const MemoryStep = int64(256) << 20
