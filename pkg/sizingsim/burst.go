package sizingsim

import "github.com/fgpu-dev/fgpu/pkg/sizing"

// burst is fgpu Auto with the burst model: each tenant is capped near its own observed peak
// (its MPS memory cap), and a GPU admits a tenant only if the tenants' recorded usage, summed
// time-aligned over the report intervals of the window, plus headroom, fits the GPU. Caps
// then may add up to more than the GPU (best-effort tenants burst into each other's room); a
// step at which a GPU's tenants together use more than it has fails someone's allocation.
//
// All of it is online and at the product's granularity: the allocator sees each tenant's
// use only as the maximum over each report interval (the plugin's usage summaries), and
// acts only when a report arrives; violations are counted at every trace step.
type burst struct {
	opts   Options
	tr     *Trace
	report int // trace steps per report interval
	window int // report intervals admission sums over
	f      *figures

	gpus []*burstGPU
	c    []*burstTenant
}

type burstGPU struct{ tenants []int }

type burstTenant struct {
	active bool
	g      int
	// cap is its memory cap; sized is false while it still holds the whole GPU it asked
	// for (no history yet), alone on it.
	cap   int64
	sized bool
	// maxima are the per-report-interval maxima of its use, from its start (index: the
	// report interval on the run's clock); peak the largest use seen; prev the last step's.
	first      int
	maxima     []int64
	peak, prev int64
	samples    int
}

// admits says whether c may join GPU g: every tenant there is sized, and over each report
// interval of the window that c and all of them recorded, their maxima summed, plus
// headroom, fit the GPU.
func (b *burst) admits(g int, c int, now int) bool {
	limit := float64(b.opts.GPUMemory) / (1 + b.opts.Sizing.Headroom)
	for k := max(0, now-b.window); k < now; k++ {
		sum, ok := b.at(c, k)
		if !ok {
			continue
		}
		for _, i := range b.gpus[g].tenants {
			if !b.c[i].sized {
				return false
			}
			v, ok2 := b.at(i, k)
			if !ok2 {
				ok = false
				break
			}
			sum += v
		}
		if ok && float64(sum) > limit {
			return false
		}
	}
	return true
}

func (b *burst) at(i, k int) (int64, bool) {
	t := b.c[i]
	if k < t.first || k-t.first >= len(t.maxima) {
		return 0, false
	}
	return t.maxima[k-t.first], true
}

// load is the largest summed maximum of g's tenants over the window: the tightest GPU that
// admits a tenant is preferred (best fit).
func (b *burst) load(g int, now int) int64 {
	var most int64
	for k := max(0, now-b.window); k < now; k++ {
		var sum int64
		for _, i := range b.gpus[g].tenants {
			v, _ := b.at(i, k)
			sum += v
		}
		most = max(most, sum)
	}
	return most
}

// place puts c on the tightest GPU that admits it (never skip), else on a GPU of its own.
func (b *burst) place(c, now, skip int) {
	t := b.c[c]
	best := -1
	if t.sized {
		for g, gpu := range b.gpus {
			if g == skip || len(gpu.tenants) == 0 || !b.admits(g, c, now) {
				continue
			}
			if best < 0 || b.load(g, now) > b.load(best, now) {
				best = g
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
	t.g = best
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

// restart stops c and starts it again, capped near its peak, where admission puts it.
func (b *burst) restart(c, now int) {
	t := b.c[c]
	skip := t.g
	b.remove(c)
	t.sized = true
	t.cap = min(b.opts.GPUMemory, roundUp(int64(float64(t.peak)*b.opts.BurstCap), sizing.MemoryStep))
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

// Burst replays the trace under fgpu Auto with the burst model (auto-burst): a tenant with
// no history holds the whole GPU it asked for, alone; once it has MinSamples steps of history
// it is restarted capped at BurstCap times its peak, where admission puts it.
func Burst(tr *Trace, opts Options) Result {
	b := &burst{opts: opts, tr: tr, f: &figures{Result: Result{Strategy: "auto-burst"}, warmFrom: warmFrom(tr, opts)}}
	b.report = reportSteps(tr, opts)
	b.window = max(1, int(opts.Window.Seconds()/tr.StepSeconds)/b.report)
	for range tr.Containers {
		b.c = append(b.c, &burstTenant{})
	}
	for t := 0; t < tr.Steps; t++ {
		k := t / b.report
		active := 0
		for i, c := range tr.Containers {
			bt := b.c[i]
			switch {
			case t == c.Start:
				*bt = burstTenant{active: true, cap: opts.GPUMemory, first: k}
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
			for len(bt.maxima) <= k-bt.first {
				bt.maxima = append(bt.maxima, 0)
			}
			bt.maxima[k-bt.first] = max(bt.maxima[k-bt.first], use)
			bt.peak = max(bt.peak, use)
			bt.samples++
			// (i) past its own cap: out of memory, restarted larger.
			if use > bt.cap {
				b.f.Violations++
				b.restart(i, k)
			}
		}
		// (ii) a GPU whose tenants together use more than it has: the allocation of the one
		// that grew most fails; it restarts, placed again.
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
				b.restart(hurt, k)
			}
		}
		for i := range tr.Containers {
			if b.c[i].active {
				b.c[i].prev = b.use(i, t)
			}
		}
		// (iii) Auto acts on each report: a tenant still on the whole GPU it asked for, with
		// enough history, is restarted at its size; one whose interval maximum nears its
		// cap is restarted larger; on a GPU whose tenants' summed maxima near its memory, the
		// one that grew most is moved.
		if (t+1)%b.report == 0 {
			for i, bt := range b.c {
				if !bt.active {
					continue
				}
				m := bt.maxima[k-bt.first]
				if !bt.sized && bt.samples >= opts.Sizing.MinSamples ||
					bt.sized && float64(m) > opts.NearCap*float64(bt.cap) && bt.cap < opts.GPUMemory {
					b.f.Restarts++
					b.restart(i, k+1)
				}
			}
			for g := range b.gpus {
				var sum int64
				move, growth := -1, int64(0)
				for _, i := range b.gpus[g].tenants {
					bt := b.c[i]
					m := bt.maxima[k-bt.first]
					sum += m
					d := m
					if k > bt.first {
						d -= bt.maxima[k-1-bt.first]
					}
					if move < 0 || d > growth {
						move, growth = i, d
					}
				}
				if len(b.gpus[g].tenants) > 1 && float64(sum) > opts.NearCap*float64(opts.GPUMemory) {
					b.f.Restarts++
					b.restart(move, k+1)
				}
			}
		}
		b.f.step(b.inUse(), active)
	}
	return b.f.done(tr.StepSeconds)
}

func (b *burst) use(i, t int) int64 {
	c := b.tr.Containers[i]
	return c.Memory[t-c.Start]
}
