package sizing

import (
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

// Window gathers a share's samples until they are summarised and published.
type Window struct {
	samples []Sample
}

// Add records a sample.
func (w *Window) Add(s Sample) { w.samples = append(w.samples, s) }

// Len is the number of samples gathered.
func (w *Window) Len() int { return len(w.samples) }

// Reset drops the samples (after a publication).
func (w *Window) Reset() { w.samples = w.samples[:0] }

// Summary summarises the samples; ok is false when there are none.
func (w *Window) Summary() (u api.ShareUsage, ok bool) {
	if len(w.samples) == 0 {
		return api.ShareUsage{}, false
	}
	mem := make([]int64, 0, len(w.samples))
	var sm []int
	var memSum, smSum int64
	for _, s := range w.samples {
		mem = append(mem, s.MemoryBytes)
		memSum += s.MemoryBytes
		if s.SMPercent >= 0 {
			sm = append(sm, s.SMPercent)
			smSum += int64(s.SMPercent)
		}
	}
	slices.Sort(mem)
	slices.Sort(sm)
	u = api.ShareUsage{
		From: w.samples[0].At, To: w.samples[len(w.samples)-1].At, Samples: len(w.samples),
		MemoryMaxBytes: mem[len(mem)-1], MemoryP95Bytes: mem[p95(len(mem))], MemoryMeanBytes: memSum / int64(len(mem)),
		SMSamples: len(sm),
	}
	if len(sm) > 0 {
		u.SMMaxPercent, u.SMP95Percent, u.SMMeanPercent = sm[len(sm)-1], sm[p95(len(sm))], int(smSum/int64(len(sm)))
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
