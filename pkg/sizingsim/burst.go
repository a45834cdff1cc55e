package sizingsim

import (
	"fmt"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// burst is fgpu Auto as the allocator runs it: every decision is pkg/sizing/engine's, the
// allocator's own, and this file only replays the trace through it (docs/sizing.md). A
// container with no recommendation yet holds the whole GPU it asked for, alone. Each report,
// the engine's Resizer judges every container as the allocator judges a pod: recreated to
// burst once its workload is measured (engine.Rebursts: not a busy workload, which keeps its
// whole GPU, nor a mostly idle one, which is time-sliced), larger near its cap, smaller
// after an hour far below it. A container placed anew bursts where the allocator's
// sizeBurst would (engine.BurstSize), guaranteed its typical interval peak (what packing
// counts) and capped at engine.CapFactor times its peak (what MPS enforces); else it gets a
// share of its recommendation, or stays whole, as Initial places it. A GPU admits a burster
// only if it holds no share that does not burst, the guaranteed memory fits, and the
// engine's History admits it; bursting shares then may add up to more than the GPU, and a
// step at which a GPU's tenants together use more than it has fails someone's allocation.
//
// All of it is online and at the product's granularity: the allocator sees each tenant's
// use only as the summary of each report interval (the plugin's), and acts only when a
// report arrives; violations are counted at every trace step.
type burst struct {
	opts    Options
	tr      *Trace
	rec     *sizing.Recommender
	hist    *engine.History[int]
	resizer *engine.Resizer
	report  int // trace steps per report interval
	f       *figures

	gpus []*burstGPU
	c    []*burstTenant
}

type burstGPU struct{ tenants []int }

type burstTenant struct {
	active bool
	g      int
	// pods counts the pods it ran as: each is a share of its own.
	pods int
	// placed is when its current pod was placed.
	placed time.Time
	// burster: a bursting share, guaranteed what packing counts of it and capped at cap.
	// Otherwise a share of cap bytes (the GPU's: a whole GPU), which MPS caps unless it is
	// time-sliced (uncapped: only its GPU's memory bounds it).
	burster         bool
	uncapped        bool
	guaranteed, cap int64
	// interval gathers its use since the last report; peak is that interval's largest, and
	// last the previous interval's; prev the last step's use.
	interval         sizing.Window
	peak, last, prev int64
}

func (b *burst) workload(i int) api.SizingWorkload {
	return api.SizingWorkload{Name: b.tr.Containers[i].ID, Request: "gpu"}
}

func (b *burst) share(i int) string { return fmt.Sprintf("%s/%d", b.tr.Containers[i].ID, b.c[i].pods) }

func (b *burst) tenants(g int) []engine.Tenant {
	var out []engine.Tenant
	for _, i := range b.gpus[g].tenants {
		out = append(out, engine.Tenant{Share: b.share(i), Workload: b.workload(i), Limit: b.c[i].cap})
	}
	return out
}

// admits says whether c, a burster, may join GPU g at now: the placement core's checks
// (no share that does not burst, the guaranteed memory fits) and the engine's admission.
func (b *burst) admits(g, c int, now time.Time) bool {
	guaranteed := b.c[c].guaranteed
	for _, i := range b.gpus[g].tenants {
		if !b.c[i].burster {
			return false
		}
		guaranteed += b.c[i].guaranteed
	}
	if guaranteed > b.opts.GPUMemory {
		return false
	}
	return b.hist.Admits(b.opts.GPUMemory, b.tenants(g), b.workload(c), b.opts.Sizing.Headroom, now) == nil
}

// fits says whether c, a share that does not burst, fits GPU g: no burster there, and the
// shares' memory, never over-committed, fits the GPU.
func (b *burst) fits(g, c int) (free int64, ok bool) {
	free = b.opts.GPUMemory - b.c[c].cap
	for _, i := range b.gpus[g].tenants {
		if b.c[i].burster {
			return 0, false
		}
		free -= b.c[i].cap
	}
	return free, free >= 0
}

// place puts c on a GPU in use (never skip): a burster on the fullest that admits it (by
// the tenants' summed use over the window), a share that does not burst best fit by memory;
// else on a GPU of its own.
func (b *burst) place(c int, now time.Time, skip int) {
	best, bestScore := -1, int64(0)
	for g, gpu := range b.gpus {
		if g == skip || len(gpu.tenants) == 0 {
			continue
		}
		var score int64
		if b.c[c].burster {
			if !b.admits(g, c, now) {
				continue
			}
			score = b.hist.Load(b.tenants(g), now)
		} else {
			free, ok := b.fits(g, c)
			if !ok {
				continue
			}
			score = -free
		}
		if best < 0 || score > bestScore {
			best, bestScore = g, score
		}
	}
	if best < 0 {
		for g, gpu := range b.gpus {
			if len(gpu.tenants) == 0 && g != skip {
				best = g
				break
			}
		}
	}
	if best < 0 {
		b.gpus = append(b.gpus, &burstGPU{})
		best = len(b.gpus) - 1
	}
	b.c[c].g, b.c[c].placed = best, now
	b.gpus[best].tenants = append(b.gpus[best].tenants, c)
}

func (b *burst) remove(c int) {
	g := b.gpus[b.c[c].g]
	for j, i := range g.tenants {
		if i == c {
			g.tenants = append(g.tenants[:j], g.tenants[j+1:]...)
			return
		}
	}
}

// restart stops c and places its next pod (never on skip) as the allocator places a new pod
// of its workload: bursting where sizeBurst would make it burst (measured, neither busy nor
// mostly idle, its cap above its guarantee), else sized as Initial sizes it (a whole GPU
// where it has no recommendation, keeps a GPU busy or would fill one). atLeast is the use
// its next pod must hold (after running out of memory, before a report told it).
func (b *burst) restart(c int, now time.Time, skip int, atLeast int64) {
	t := b.c[c]
	b.remove(c)
	b.hist.ForgetShare(b.share(c))
	b.resizer.ForgetShare(b.share(c))
	t.pods++
	w := b.workload(c)
	rec, ready := b.rec.Recommend(w)
	rec.MemoryBytes = max(rec.MemoryBytes, b.resizer.Floor(w))
	rec.PeakBytes = max(rec.PeakBytes, atLeast)
	gpu := b.opts.GPUMemory
	t.burster, t.uncapped = false, false
	guaranteed, capBytes, ok := engine.BurstSize(rec, gpu)
	switch {
	case ready && ok && b.hist.Measured(w, now) && rec.ComputePercent < engine.BusyComputePercent && rec.ComputePercent > engine.IdleComputePercent:
		t.burster, t.guaranteed, t.cap = true, guaranteed, capBytes
	case !ready || rec.ComputePercent >= engine.BusyComputePercent:
		t.guaranteed, t.cap = gpu, gpu
	default:
		size := engine.RoundUp(max(rec.MemoryBytes, int64(float64(atLeast)*(1+b.opts.Sizing.Headroom))), sizing.MemoryStep)
		t.cap = min(gpu, size)
		t.guaranteed = t.cap
		t.uncapped = rec.ComputePercent <= engine.IdleComputePercent
	}
	b.place(c, now, skip)
}

func (b *burst) inUse() int {
	n := 0
	for _, g := range b.gpus {
		if len(g.tenants) > 0 {
			n++
		}
	}
	return n
}

// Auto replays the trace under fgpu Auto, through the allocator's sizing engine.
func Auto(tr *Trace, opts Options, progress func(done, total int)) Result {
	b := &burst{opts: opts, tr: tr, rec: sizing.NewRecommender(opts.Sizing), resizer: engine.NewResizer(opts.Sizing.Headroom, opts.ShrinkAfter),
		f: &figures{Result: Result{Strategy: "auto"}, warmFrom: warmFrom(tr, opts)}}
	b.report = reportSteps(tr, opts)
	step := time.Duration(tr.StepSeconds * float64(time.Second))
	// The clock's intervals are the trace's report intervals, so each summary is one interval.
	clock := sizing.Clock{Width: time.Duration(b.report) * step}
	clock.Window = max(1, int(opts.Window/clock.Width))
	b.hist = engine.NewHistory[int](clock)
	t0 := time.Unix(0, 0)
	for range tr.Containers {
		b.c = append(b.c, &burstTenant{})
	}
	for t := 0; t < tr.Steps; t++ {
		now := t0.Add(time.Duration(t) * step)
		active := 0
		for i, c := range tr.Containers {
			bt := b.c[i]
			switch {
			case t == c.Start:
				*bt = burstTenant{active: true, cap: opts.GPUMemory, guaranteed: opts.GPUMemory}
				b.place(i, now, -1)
			case t == c.Start+len(c.Memory):
				b.remove(i)
				bt.active = false
			}
			if !bt.active {
				continue
			}
			active++
			use := c.Memory[t-c.Start]
			bt.interval.Add(sizing.Sample{At: now, MemoryBytes: use, SMPercent: c.SM[t-c.Start]})
			bt.peak = max(bt.peak, use)
			// (i) past its own cap: out of memory, restarted larger.
			if use > bt.cap && !bt.uncapped {
				b.f.Violations++
				b.restart(i, now, -1, bt.peak)
			}
		}
		// (ii) a GPU whose tenants together use more than it has: the allocation of the one
		// that grew most fails; it restarts elsewhere.
		for g := range b.gpus {
			for {
				var sum int64
				hurt, growth := -1, int64(0)
				for _, i := range b.gpus[g].tenants {
					use := b.use(i, t)
					sum += use
					if d := use - b.c[i].prev; hurt < 0 || d > growth {
						hurt, growth = i, d
					}
				}
				if sum <= opts.GPUMemory {
					break
				}
				b.f.Violations++
				b.f.OverfullViolations++
				b.restart(hurt, now, g, 0)
			}
		}
		for i := range tr.Containers {
			if b.c[i].active {
				b.c[i].prev = b.use(i, t)
			}
		}
		if (t+1)%b.report == 0 {
			b.reported(now)
		}
		b.f.step(b.inUse(), active)
		if progress != nil && t%100 == 0 {
			progress(t, tr.Steps)
		}
	}
	return b.f.done(tr.StepSeconds)
}

// reported takes each container's summary of the interval ending at now into the
// recommender and the engine's History, then acts on the engine's decisions as the
// allocator does on a report: the Resizer's for each container, engine.Overfull for each
// GPU, and consolidation.
func (b *burst) reported(now time.Time) {
	usage := make([]*api.ShareUsage, len(b.c))
	for i, bt := range b.c {
		if !bt.active {
			continue
		}
		u, ok := bt.interval.Summary()
		bt.interval.Reset()
		if !ok {
			continue
		}
		usage[i] = &u
		b.rec.Add(b.workload(i), b.share(i), u)
		b.hist.Record(b.workload(i), b.share(i), u, now)
	}
	for i, bt := range b.c {
		if !bt.active || usage[i] == nil {
			continue
		}
		w := b.workload(i)
		rec, ready := b.rec.Recommend(w)
		in := engine.Report{Workload: w, Share: b.share(i), Usage: *usage[i], Cap: bt.cap, Bursting: bt.burster, GPUMemory: b.opts.GPUMemory,
			MayBurst: func(rec api.SizingRecommendation) bool {
				// As shouldBurst: its pod placed before its workload was measured.
				since := b.hist.MeasuredSince(w)
				return !since.IsZero() && bt.placed.Before(since) && b.hist.Measured(w, now) && engine.Rebursts(rec, bt.cap, b.opts.GPUMemory, 0)
			},
			// As restart places it: a busy workload keeps the whole GPU it asked for.
			ComesBackWhole: func(rec api.SizingRecommendation) bool {
				return bt.cap >= b.opts.GPUMemory && rec.ComputePercent >= engine.BusyComputePercent
			}}
		switch b.resizer.Decide(in, rec, ready).Resize {
		case engine.Grow, engine.ToBurst, engine.Shrink:
			b.f.Restarts++
			b.restart(i, now, -1, 0)
		}
	}
	for g := range b.gpus {
		tenants := b.gpus[g].tenants
		uses := make([]engine.Use, len(tenants))
		all := true
		for j, i := range tenants {
			uses[j] = engine.Use{Cur: b.c[i].peak, Prev: b.c[i].last}
			all = all && b.c[i].burster
		}
		if move, _, ok := engine.Overfull(uses, b.opts.GPUMemory); all && ok {
			b.f.Restarts++
			b.restart(tenants[move], now, g, 0)
		}
	}
	b.consolidate(now)
	for _, bt := range b.c {
		bt.last, bt.peak = bt.peak, 0
	}
}

// consolidate empties one GPU per report as the allocator's consolidation does, in the
// engine's order (engine.Candidates) and by its one-tenant-per-GPU rule (engine.Assign),
// admission standing in for the placement path's checks. Its tenants restart elsewhere.
func (b *burst) consolidate(now time.Time) {
	var all []engine.Candidate[int]
	var inUse []int
	for g, gpu := range b.gpus {
		if len(gpu.tenants) == 0 {
			continue
		}
		inUse = append(inUse, g)
		c := engine.Candidate[int]{GPU: g}
		for _, i := range gpu.tenants {
			if !b.c[i].burster {
				c.Guaranteed = -1
				break
			}
			c.Guaranteed += b.c[i].guaranteed
		}
		if c.Guaranteed >= 0 {
			all = append(all, c)
		}
	}
	for _, g := range engine.Candidates(all) {
		tenants := b.gpus[g].tenants
		others := make([]int, 0, len(inUse))
		for _, h := range inUse {
			if h != g {
				others = append(others, h)
			}
		}
		if _, ok := engine.Assign(len(tenants), others, func(j, h int) bool { return b.admits(h, tenants[j], now) }); !ok {
			continue
		}
		for _, i := range append([]int(nil), tenants...) {
			b.f.Restarts++
			b.f.Consolidations++
			b.restart(i, now, g, 0)
		}
		return
	}
}

func (b *burst) use(i, t int) int64 {
	c := b.tr.Containers[i]
	return c.Memory[t-c.Start]
}
