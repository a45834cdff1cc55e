package sizing

import (
	"cmp"
	"math"
	"slices"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Sample is one measurement of a share: its processes' memory, and their SM activity in
// percent or -1 where the driver gave no sample.
type Sample struct {
	At          time.Time
	MemoryBytes int64
	SMPercent   int
}

// Window gathers a share's samples until they are summarised and published. Fold keeps it
// bounded where publication may be late: the older samples go into a summary that keeps
// their count, span, sums and maxima exactly and their distribution as counts by value.
type Window struct {
	samples []Sample
	folded  folded
}

// folded is what Fold kept of the samples it took: how many fell in each memory bucket (each
// foldRatio times as wide as the one before, so that a bucket's top is within 1 % of any value
// in it) and how many had each SM percentage.
type folded struct {
	n           int
	from, to    time.Time
	memSum      int64
	memMax      int64
	smN         int
	smSum, smMx int64
	mem, sm     map[int64]int
}

// foldRatio is how much wider each folded memory bucket is than the one before: a folded
// percentile is at most 1 % above the true one.
const foldRatio = 1.01

// memBucket is the bucket of a memory value: 0 for under 1 MiB, then buckets that grow by
// foldRatio. bucketTop is the largest value a bucket counts as.
func memBucket(v int64) int64 {
	if v < 1<<20 {
		return 0
	}
	return 1 + int64(math.Floor(math.Log(float64(v)/(1<<20))/math.Log(foldRatio)))
}

func bucketTop(b int64) int64 {
	if b == 0 {
		return 1 << 20
	}
	return int64(math.Ceil((1 << 20) * math.Pow(foldRatio, float64(b))))
}

type point struct {
	v int64
	w int
}

// Add records a sample.
func (w *Window) Add(s Sample) { w.samples = append(w.samples, s) }

// Len is the number of samples gathered and not folded.
func (w *Window) Len() int { return len(w.samples) }

// Reset drops the samples, folded ones too (after a publication).
func (w *Window) Reset() { w.samples, w.folded = w.samples[:0], folded{} }

// Bound folds all but the newest half of the samples once there are more than limit: a
// window whose summaries cannot be published for a while (failing writes) stays bounded.
func (w *Window) Bound(limit int) {
	if len(w.samples) > limit {
		w.Fold(limit / 2)
	}
}

// Fold summarises all but the newest keep samples into the window's folded summary, which
// Summary counts as it counts the samples: the count, span, mean and maximum exactly, the
// 95th percentile of memory never below the true one and at most 1 % above it, of SM
// activity exactly. What it keeps grows with the distinct values, not with the samples.
func (w *Window) Fold(keep int) {
	n := len(w.samples) - max(keep, 0)
	if n <= 0 {
		return
	}
	f := &w.folded
	if f.mem == nil {
		f.mem, f.sm = map[int64]int{}, map[int64]int{}
	}
	for _, s := range w.samples[:n] {
		if f.n == 0 {
			f.from = s.At
		}
		f.n++
		f.to = s.At
		f.memSum += s.MemoryBytes
		f.memMax = max(f.memMax, s.MemoryBytes)
		f.mem[memBucket(s.MemoryBytes)]++
		if s.SMPercent >= 0 {
			f.smN++
			f.smSum += int64(s.SMPercent)
			f.smMx = max(f.smMx, int64(s.SMPercent))
			f.sm[int64(s.SMPercent)]++
		}
	}
	w.samples = append(w.samples[:0], w.samples[n:]...)
}

// percentile95 is the value at the 95th percentile's rank (nearest rank) among points.
func percentile95(ps []point) int64 {
	slices.SortFunc(ps, func(a, b point) int { return cmp.Compare(a.v, b.v) })
	total := 0
	for _, p := range ps {
		total += p.w
	}
	rank, sum := p95(total)+1, 0
	for _, p := range ps {
		if sum += p.w; sum >= rank {
			return p.v
		}
	}
	return ps[len(ps)-1].v
}

// Summary summarises the samples, folded ones with them; ok is false when there are none.
func (w *Window) Summary() (u api.ShareUsage, ok bool) {
	f := w.folded
	if len(w.samples) == 0 && f.n == 0 {
		return api.ShareUsage{}, false
	}
	mem := make([]point, 0, len(f.mem)+len(w.samples))
	for b, c := range f.mem {
		mem = append(mem, point{min(bucketTop(b), f.memMax), c})
	}
	sm := make([]point, 0, len(f.sm)+len(w.samples))
	for v, c := range f.sm {
		sm = append(sm, point{v, c})
	}
	folds := len(sm)
	memSum, smSum, memMax, smMax := f.memSum, f.smSum, f.memMax, f.smMx
	for _, s := range w.samples {
		mem = append(mem, point{s.MemoryBytes, 1})
		memSum += s.MemoryBytes
		memMax = max(memMax, s.MemoryBytes)
		if s.SMPercent >= 0 {
			sm = append(sm, point{int64(s.SMPercent), 1})
			smSum += int64(s.SMPercent)
			smMax = max(smMax, int64(s.SMPercent))
		}
	}
	n, smN := f.n+len(w.samples), f.smN+len(sm)-folds
	u = api.ShareUsage{Samples: n, MemoryMaxBytes: memMax, MemoryP95Bytes: percentile95(mem), MemoryMeanBytes: memSum / int64(n), SMSamples: smN}
	if f.n > 0 {
		u.From = f.from
	} else {
		u.From = w.samples[0].At
	}
	if len(w.samples) > 0 {
		u.To = w.samples[len(w.samples)-1].At
	} else {
		u.To = f.to
	}
	if smN > 0 {
		u.SMMaxPercent, u.SMP95Percent, u.SMMeanPercent = int(smMax), int(percentile95(sm)), int(smSum/int64(smN))
	}
	return u, true
}

// p95 is the index of the 95th percentile in n sorted values (nearest rank).
func p95(n int) int { return max(0, (95*n+99)/100-1) }

// Thresholds below which a new summary is not worth an API write: the memory step of a share
// or a tenth of the value, and 10 points of SM activity.
const (
	memoryChangeFloor = int64(256) << 20
	smChangePoints    = 10
)

// Differs says whether u moved from prev by more than the publication thresholds: the
// recommender would size differently from it.
func Differs(u, prev api.ShareUsage) bool {
	memMoved := func(a, b int64) bool {
		return abs(a-b) > max(memoryChangeFloor, b/10)
	}
	smMoved := func(a, b int) bool { return abs(int64(a-b)) > smChangePoints }
	return memMoved(u.MemoryMaxBytes, prev.MemoryMaxBytes) || memMoved(u.MemoryP95Bytes, prev.MemoryP95Bytes) ||
		smMoved(u.SMP95Percent, prev.SMP95Percent) || smMoved(u.SMMeanPercent, prev.SMMeanPercent)
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
