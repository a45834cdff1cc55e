package engine

import (
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

const (
	// CapFactor: a bursting share is capped at this multiple of its workload's observed peak
	// (docs/sizing.md measures 1.5 against 2).
	CapFactor = 2
	// MinIntervals: a workload is admitted by its history once it recorded this many report
	// intervals (half an hour at the default 5 minutes, as the recommender's minimum of
	// samples): fewer say too little about when its peaks come, and each interval more keeps
	// every new workload on the whole GPUs it asked for longer (docs/sizing.md measures both).
	MinIntervals = 6
	// NearCap: a report's peak above this share of the cap asks for a larger pod, and a GPU
	// whose tenants' use passes it has one moved off; FarBelow: every report under this
	// share for the shrink window asks for a smaller one.
	NearCap  = 0.95
	FarBelow = 0.8
	// BusyComputePercent and IdleComputePercent bound a recommended compute share (SM p90
	// plus headroom): at or above the first a workload keeps a GPU busy (it keeps a whole
	// GPU it asked for), at or below the second it is mostly idle (time-slicing when
	// best-effort). Neither bursts.
	BusyComputePercent = 90
	IdleComputePercent = 10
)

// RoundUp rounds v up to a multiple of step, at least one step.
func RoundUp(v, step int64) int64 {
	if v <= 0 {
		return step
	}
	return (v + step - 1) / step * step
}

// BurstSize is what a bursting share of a workload measured as rec is guaranteed (its
// typical report peak, what packing counts) and capped at (CapFactor times its peak, what
// MPS enforces), both at most asked where it asks (> 0); ok is false where the cap would not
// be above the guarantee: such a share has nothing to burst to.
func BurstSize(rec api.SizingRecommendation, asked int64) (guaranteed, capBytes int64, ok bool) {
	guaranteed = max(sizing.MemoryStep, rec.TypicalBytes)
	capBytes = BurstCap(rec)
	if asked > 0 {
		guaranteed, capBytes = min(guaranteed, asked), min(capBytes, asked)
	}
	return guaranteed, capBytes, capBytes > guaranteed
}

// BurstCap is the cap of a bursting share of a workload measured as rec, before what it asks
// bounds it.
func BurstCap(rec api.SizingRecommendation) int64 {
	return RoundUp(int64(float64(rec.PeakBytes)*CapFactor), sizing.MemoryStep)
}

// Rebursts says whether a running share that does not burst, capped at capBytes on a GPU of
// gpuMem bytes (0: unknown) and asking asked (0: a whole GPU), would burst if placed again
// with its workload measured as rec: its use is neither busy (it keeps its whole GPU) nor
// idle (time-slicing), a whole GPU it asked for is not one the recommendation fills (it
// would stay whole), and a bursting share would be guaranteed less than both its cap now and
// its burst cap.
func Rebursts(rec api.SizingRecommendation, capBytes, gpuMem, asked int64) bool {
	if asked == 0 && gpuMem > 0 && rec.MemoryBytes >= gpuMem {
		return false
	}
	guaranteed := max(sizing.MemoryStep, rec.TypicalBytes)
	return rec.ComputePercent < BusyComputePercent && rec.ComputePercent > IdleComputePercent && guaranteed < capBytes && guaranteed < BurstCap(rec)
}

// Use is a tenant's use in a GPU's newest reported interval and in the one before.
type Use struct{ Cur, Prev int64 }

// Overfull is the tenant to move off a GPU of memCap bytes whose (two or more) bursting
// tenants together used more than NearCap of it in its newest interval: the one that grew
// most (the first of those that grew as much). ok is false where none is to move.
func Overfull(uses []Use, memCap int64) (move int, sum int64, ok bool) {
	if len(uses) < 2 {
		return 0, 0, false
	}
	for i, u := range uses {
		sum += u.Cur
		if u.Cur-u.Prev > uses[move].Cur-uses[move].Prev {
			move = i
		}
	}
	return move, sum, float64(sum) > NearCap*float64(memCap)
}

// Resize is what Auto wants done with a running pod after its share's usage report.
type Resize int

const (
	// Keep: nothing.
	Keep Resize = iota
	// Grow: recreated larger, at least Decision.Want (the workload's floor).
	Grow
	// AtRequest: its use nears a cap that is all its claim asks; Auto never gives more.
	AtRequest
	// ToBurst: recreated to burst, its pod placed before its workload was measured.
	ToBurst
	// Shrink: recreated smaller, at the recommendation, its reports far below its cap
	// since Decision.Since.
	Shrink
)

// Resizer is Auto's per-claim rule: a running pod whose measured use nears its memory cap,
// or stayed far below it for the shrink window, is recreated at the new size. It is not safe
// for concurrent use (the allocator holds its sizer's lock).
type Resizer struct {
	headroom    float64
	shrinkAfter time.Duration
	// lowSince: since when each share's reports stayed far below its cap.
	lowSince map[string]time.Time
	// floor: a workload recreated to grow gets at least this much memory in its next pods,
	// whatever its percentile says.
	floor map[api.SizingWorkload]int64
}

// NewResizer grows to the peak plus headroom and shrinks after shrinkAfter far below the cap.
func NewResizer(headroom float64, shrinkAfter time.Duration) *Resizer {
	return &Resizer{headroom: headroom, shrinkAfter: shrinkAfter, lowSince: map[string]time.Time{}, floor: map[api.SizingWorkload]int64{}}
}

// Report is one usage summary of a running share under sizing Auto, with what Decide weighs.
type Report struct {
	Workload api.SizingWorkload
	Share    string
	Usage    api.ShareUsage
	// Cap is what the share may use: its burst cap where Bursting, else what it consumes.
	Cap      int64
	Bursting bool
	// GPUMemory is its GPU's (0: unknown); Asked what its claim asks (0: a whole GPU).
	GPUMemory, Asked int64
	// MayBurst says whether, placed again with its workload measured as rec, the share
	// would burst (asked only of a share that does not, once its workload is measured).
	MayBurst func(rec api.SizingRecommendation) bool
	// ComesBackWhole says whether, placed again with its workload measured as rec, the share
	// would get the whole GPU it holds again (a busy workload keeps the whole GPU it asked
	// for): shrinking it would only restart it.
	ComesBackWhole func(rec api.SizingRecommendation) bool
}

// Decision is what Decide wants: Want is the grown size, Since when a shrink's low use began;
// Rec is the workload's recommendation as Decide saw it (its floor applied).
type Decision struct {
	Resize Resize
	Want   int64
	Since  time.Time
	Rec    api.SizingRecommendation
}

// Decide judges a share's usage report, with its workload's recommendation rec (ready: it
// has one): a bursting share is sized from its workload's whole history already, so it is
// never recreated smaller.
func (r *Resizer) Decide(in Report, rec api.SizingRecommendation, ready bool) Decision {
	rec.MemoryBytes = max(rec.MemoryBytes, r.floor[in.Workload])
	d := Decision{Rec: rec}
	peak := in.Usage.MemoryMaxBytes
	switch {
	case float64(peak) > NearCap*float64(in.Cap):
		delete(r.lowSince, in.Share)
		d.Want = RoundUp(max(rec.MemoryBytes, int64(float64(peak)*(1+r.headroom))), sizing.MemoryStep)
		switch {
		case in.GPUMemory > 0 && in.Cap >= in.GPUMemory:
			// a whole GPU: there is no more to give
		case in.Asked > 0 && in.Asked <= in.Cap:
			d.Resize = AtRequest
		default:
			r.floor[in.Workload] = max(r.floor[in.Workload], d.Want)
			d.Resize = Grow
		}
	case !in.Bursting && ready && in.MayBurst != nil && in.MayBurst(rec):
		d.Resize = ToBurst
	case !in.Bursting && ready && float64(peak) < FarBelow*float64(in.Cap) && rec.MemoryBytes+sizing.MemoryStep <= in.Cap &&
		(in.ComesBackWhole == nil || !in.ComesBackWhole(rec)):
		since, ok := r.lowSince[in.Share]
		if !ok {
			since = in.Usage.From
			r.lowSince[in.Share] = since
		}
		if in.Usage.To.Sub(since) >= r.shrinkAfter {
			d.Resize, d.Since = Shrink, since
		}
	default:
		delete(r.lowSince, in.Share)
	}
	return d
}

// Floor is the least memory w's next pods get after one was recreated to grow (0: none).
func (r *Resizer) Floor(w api.SizingWorkload) int64 { return r.floor[w] }

// Low says whether share's reports are still far below its cap.
func (r *Resizer) Low(share string) bool {
	_, ok := r.lowSince[share]
	return ok
}

// ForgetShare drops a share that is gone.
func (r *Resizer) ForgetShare(share string) { delete(r.lowSince, share) }

// KeepWorkloads forgets the floors of the workloads keep says no.
func (r *Resizer) KeepWorkloads(keep func(api.SizingWorkload) bool) {
	for w := range r.floor {
		if !keep(w) {
			delete(r.floor, w)
		}
	}
}
