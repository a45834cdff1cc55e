package sizingsim

import (
	"sort"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// burst is fgpu Auto as the allocator builds it, the burst model (docs/sizing.md): a
// container with no recommendation yet holds the whole GPU it asked for, alone; once its
// workload has one it is restarted as a burster, guaranteed its typical interval peak (what
// packing counts) and capped at BurstCap times its peak (what MPS enforces). A GPU admits a
// burster only if it holds no non-burster, the guaranteed memory fits, and the tenants'
// recorded interval maxima, summed in time with the newcomer's workload's, stay within the
// GPU over 1 + headroom (sizing.Admit, as the allocator calls it). Caps then may add up to
// more than the GPU; a step at which a GPU's tenants together use more than it has fails
// someone's allocation.
//
// All of it is online and at the product's granularity: the allocator sees each tenant's
// use only as the summary of each report interval (the plugin's), and acts only when a
// report arrives; violations are counted at every trace step.
type burst struct {
	opts   Options
	tr     *Trace
	rec    *sizing.Recommender
	clock  sizing.Clock
	report int // trace steps per report interval
	f      *figures

	gpus []*burstGPU
	c    []*burstTenant
}

type burstGPU struct{ tenants []int }

type burstTenant struct {
	active bool
	g      int
	// burster is false while it holds the whole GPU it asked for, alone (no recommendation
	// yet); guaranteed is what packing counts of it, cap what MPS enforces.
	burster         bool
	guaranteed, cap int64
	// share is the maxima of its current pod's share, workload those of every pod it ran
	// as (in the trace each container is its own workload).
	share, workload sizing.Maxima
	// interval gathers its use since the last report; peak is that interval's largest, and
	// last the previous interval's; prev the last step's use.
	interval         sizing.Window
	peak, last, prev int64
}

func (b *burst) workload(i int) api.SizingWorkload {
	return api.SizingWorkload{Name: b.tr.Containers[i].ID, Request: "gpu"}
}

// series is what admission counts tenant i at in interval k, as the allocator counts it
// (sizing.Counted).
func (b *burst) series(i int) func(int64) int64 {
	t := b.c[i]
	return sizing.Counted(&t.share, &t.workload, t.cap)
}

// admits says whether burster c may join GPU g at interval now.
func (b *burst) admits(g, c int, now int64) bool {
	guaranteed := b.c[c].guaranteed
	var tenants []func(int64) int64
	for _, i := range b.gpus[g].tenants {
		if !b.c[i].burster {
			return false
		}
		guaranteed += b.c[i].guaranteed
		tenants = append(tenants, b.series(i))
	}
	if guaranteed > b.opts.GPUMemory {
		return false
	}
	limit := int64(float64(b.opts.GPUMemory) / (1 + b.opts.Sizing.Headroom))
	ok, _, _ := sizing.Admit(limit, now-int64(b.clock.Window)+1, now, sizing.Expected(&b.c[c].workload), tenants)
	return ok
}

// load is the largest summed maximum of g's tenants over the window: among the GPUs that
// admit a burster the fullest is chosen.
func (b *burst) load(g int, now int64) int64 {
	var tenants []func(int64) int64
	for _, i := range b.gpus[g].tenants {
		tenants = append(tenants, b.series(i))
	}
	var most int64
	for k := now - int64(b.clock.Window) + 1; k <= now; k++ {
		var sum int64
		for _, t := range tenants {
			sum += t(k)
		}
		most = max(most, sum)
	}
	return most
}

// place puts c on the fullest GPU that admits it (never skip) if it is a burster, else on a
// GPU of its own.
func (b *burst) place(c int, now int64, skip int) {
	best, bestLoad := -1, int64(0)
	if b.c[c].burster {
		for g, gpu := range b.gpus {
			if g == skip || len(gpu.tenants) == 0 || !b.admits(g, c, now) {
				continue
			}
			if l := b.load(g, now); best < 0 || l > bestLoad {
				best, bestLoad = g, l
			}
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
	b.c[c].g = best
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

// restart stops c and starts it again as a burster sized from its workload's
// recommendation (every container restarted has one) and the use seen since, where
// admission puts it, never on skip.
func (b *burst) restart(c int, now int64, skip int) {
	t := b.c[c]
	b.remove(c)
	rec, _ := b.rec.Recommend(b.workload(c))
	t.burster = true
	t.guaranteed = min(b.opts.GPUMemory, max(sizing.MemoryStep, rec.TypicalBytes))
	peak := max(rec.PeakBytes, t.peak)
	t.cap = max(t.guaranteed, min(b.opts.GPUMemory, roundUp(int64(float64(peak)*b.opts.BurstCap), sizing.MemoryStep)))
	t.share = sizing.Maxima{}
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

// Auto replays the trace under fgpu Auto, the burst model.
func Auto(tr *Trace, opts Options, progress func(done, total int)) Result {
	b := &burst{opts: opts, tr: tr, rec: sizing.NewRecommender(opts.Sizing),
		f: &figures{Result: Result{Strategy: "auto"}, warmFrom: warmFrom(tr, opts)}}
	b.report = reportSteps(tr, opts)
	step := time.Duration(tr.StepSeconds * float64(time.Second))
	// The clock's intervals are the trace's report intervals, so each summary is one interval.
	b.clock = sizing.Clock{Width: time.Duration(b.report) * step}
	b.clock.Window = max(1, int(opts.Window/b.clock.Width))
	t0 := time.Unix(0, 0)
	for range tr.Containers {
		b.c = append(b.c, &burstTenant{})
	}
	for t := 0; t < tr.Steps; t++ {
		now := t0.Add(time.Duration(t) * step)
		k := b.clock.Interval(now)
		active := 0
		for i, c := range tr.Containers {
			bt := b.c[i]
			switch {
			case t == c.Start:
				*bt = burstTenant{active: true, cap: opts.GPUMemory, guaranteed: opts.GPUMemory}
				b.place(i, k, -1)
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
			if use > bt.cap {
				b.f.Violations++
				b.restart(i, k, -1)
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
				b.restart(hurt, k, g)
			}
		}
		for i := range tr.Containers {
			if b.c[i].active {
				b.c[i].prev = b.use(i, t)
			}
		}
		if (t+1)%b.report == 0 {
			b.reported(k)
		}
		b.f.step(b.inUse(), active)
		if progress != nil && t%100 == 0 {
			progress(t, tr.Steps)
		}
	}
	return b.f.done(tr.StepSeconds)
}

// reported takes each container's summary of interval k into the recommender and the maxima,
// then acts as Auto does on a report: a container with a recommendation that still holds a
// whole GPU, or a burster whose interval peak nears its cap, is restarted at its new sizes;
// on a GPU whose tenants' summed interval peaks near its memory, the one that grew most is
// moved.
func (b *burst) reported(k int64) {
	for i, bt := range b.c {
		if !bt.active {
			continue
		}
		u, ok := bt.interval.Summary()
		bt.interval.Reset()
		if !ok {
			continue
		}
		b.rec.Add(b.workload(i), b.tr.Containers[i].ID, u)
		bt.share.Record(b.clock, u.From, u.To, u.MemoryMaxBytes)
		bt.workload.Record(b.clock, u.From, u.To, u.MemoryMaxBytes)
	}
	for i, bt := range b.c {
		if !bt.active {
			continue
		}
		_, ready := b.rec.Recommend(b.workload(i))
		if !bt.burster && ready ||
			bt.burster && float64(bt.peak) > b.opts.NearCap*float64(bt.cap) && bt.cap < b.opts.GPUMemory {
			b.f.Restarts++
			b.restart(i, k, -1)
		}
	}
	for g := range b.gpus {
		var sum int64
		move, growth := -1, int64(0)
		for _, i := range b.gpus[g].tenants {
			bt := b.c[i]
			sum += bt.peak
			if d := bt.peak - bt.last; move < 0 || d > growth {
				move, growth = i, d
			}
		}
		if len(b.gpus[g].tenants) > 1 && float64(sum) > b.opts.NearCap*float64(b.opts.GPUMemory) {
			b.f.Restarts++
			b.restart(move, k, g)
		}
	}
	b.consolidate(k)
	for _, bt := range b.c {
		bt.last, bt.peak = bt.peak, 0
	}
}

// consolidate empties one GPU per report, as Auto does (the allocator's consolidate): the
// one with the least guaranteed memory, among those whose tenants all burst, whose tenants
// each have another GPU in use that admits it, one tenant per GPU. Its tenants restart there.
func (b *burst) consolidate(k int64) {
	type candidate struct {
		g          int
		guaranteed int64
	}
	var order []candidate
	for g, gpu := range b.gpus {
		if len(gpu.tenants) == 0 {
			continue
		}
		c := candidate{g: g}
		for _, i := range gpu.tenants {
			if !b.c[i].burster {
				c.guaranteed = -1
				break
			}
			c.guaranteed += b.c[i].guaranteed
		}
		if c.guaranteed >= 0 {
			order = append(order, c)
		}
	}
	sort.SliceStable(order, func(x, y int) bool { return order[x].guaranteed < order[y].guaranteed })
	for _, c := range order {
		taken := map[int]bool{c.g: true}
		fits := true
		for _, i := range b.gpus[c.g].tenants {
			to := -1
			for h, gpu := range b.gpus {
				if !taken[h] && len(gpu.tenants) > 0 && b.admits(h, i, k) {
					to = h
					break
				}
			}
			if to < 0 {
				fits = false
				break
			}
			taken[to] = true
		}
		if !fits {
			continue
		}
		for _, i := range append([]int(nil), b.gpus[c.g].tenants...) {
			b.f.Restarts++
			b.f.Consolidations++
			b.restart(i, k, c.g)
		}
		return
	}
}

func (b *burst) use(i, t int) int64 {
	c := b.tr.Containers[i]
	return c.Memory[t-c.Start]
}
