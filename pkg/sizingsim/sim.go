package sizingsim

import (
	"fmt"
	"math"
	"sort"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// Options set a run.
type Options struct {
	// GPUMemory is each GPU's memory (80 GiB).
	GPUMemory int64
	// Sizing is the recommender's; MinSamples counts trace steps.
	Sizing sizing.Options
	// Report is the plugin's usage report interval: the allocator sees a container's use
	// only as each interval's summary, and acts only when one arrives.
	Report time.Duration
	// Window is how much of the tenants' time-aligned history Auto's admission sums.
	Window time.Duration
	// ShrinkAfter is the allocator's --sizing-shrink-after: Auto recreates a pod smaller once
	// its use stayed far below its cap this long.
	ShrinkAfter time.Duration
}

// DefaultOptions are the allocator's defaults on 80 GiB GPUs, half an hour of history at
// the trace's step.
func DefaultOptions(stepSeconds float64) Options {
	s := sizing.DefaultOptions()
	s.MinSamples = int(math.Ceil(1800 / stepSeconds))
	return Options{GPUMemory: 80 << 30, Sizing: s, Report: 5 * time.Minute, Window: 24 * time.Hour, ShrinkAfter: time.Hour}
}

// Result is one strategy's figures.
type Result struct {
	Strategy string  `json:"strategy"`
	GPUsPeak int     `json:"gpus_peak"`
	GPUsMean float64 `json:"gpus_mean"`
	// GPUsPeakWarm and GPUsMeanWarm leave out the first history window and report interval
	// (warmFrom), while every container of the trace's cold start holds what it asked for.
	GPUsPeakWarm     int     `json:"gpus_peak_after_history"`
	GPUsMeanWarm     float64 `json:"gpus_mean_after_history"`
	ContainersPerGPU float64 `json:"containers_per_gpu"`
	Violations       int     `json:"violations"`
	// OverfullViolations are the violations from a GPU whose tenants together needed more
	// than it has (the burst model's; the rest passed a tenant's own cap).
	OverfullViolations int     `json:"overfull_violations"`
	ViolationsPer100h  float64 `json:"violations_per_100h"`
	// Restarts are the pods Auto restarted to resize or move them before they ran out of
	// memory; HurtPer100h counts them with the violations.
	Restarts int `json:"restarts"`
	// Consolidations are the restarts that moved a container off a GPU Auto emptied.
	Consolidations int     `json:"consolidations"`
	HurtPer100h    float64 `json:"hurt_per_100h"`
}

// pool is GPUs placed on online, best fit by memory: a container goes to the GPU it leaves
// the least memory free on; a GPU with no container is given back.
type pool struct {
	capacity int64
	free     []int64
	tenants  []int
}

func (p *pool) place(size int64) int {
	best := -1
	for g, f := range p.free {
		if p.tenants[g] > 0 && f >= size && (best < 0 || f < p.free[best]) {
			best = g
		}
	}
	if best < 0 {
		for g := range p.free {
			if p.tenants[g] == 0 {
				best = g
				break
			}
		}
	}
	if best < 0 {
		p.free = append(p.free, p.capacity)
		p.tenants = append(p.tenants, 0)
		best = len(p.free) - 1
	}
	p.free[best] -= size
	p.tenants[best]++
	return best
}

func (p *pool) remove(g int, size int64) {
	p.free[g] += size
	p.tenants[g]--
}

func (p *pool) inUse() int {
	n := 0
	for _, t := range p.tenants {
		if t > 0 {
			n++
		}
	}
	return n
}

// figures accumulates GPUs in use and container-steps over the run.
type figures struct {
	Result
	gpuSteps, containerSteps, steps, warmGPUSteps int
	// warmFrom is the first step after the history window.
	warmFrom int
}

func (f *figures) step(gpus, containers int) {
	f.GPUsPeak = max(f.GPUsPeak, gpus)
	if f.steps >= f.warmFrom {
		f.GPUsPeakWarm = max(f.GPUsPeakWarm, gpus)
		f.warmGPUSteps += gpus
	}
	f.gpuSteps += gpus
	f.containerSteps += containers
	f.steps++
}

func (f *figures) done(stepSeconds float64) Result {
	r := f.Result
	if f.steps > 0 {
		r.GPUsMean = float64(f.gpuSteps) / float64(f.steps)
	}
	if f.steps > f.warmFrom {
		r.GPUsMeanWarm = float64(f.warmGPUSteps) / float64(f.steps-f.warmFrom)
	}
	if f.gpuSteps > 0 {
		r.ContainersPerGPU = float64(f.containerSteps) / float64(f.gpuSteps)
	}
	if hours := float64(f.containerSteps) * stepSeconds / 3600; hours > 0 {
		r.ViolationsPer100h = float64(r.Violations) / hours * 100
		r.HurtPer100h = float64(r.Violations+r.Restarts) / hours * 100
	}
	return r
}

// warmFrom is the first step at which every container that started with the run has had its
// history and a report since.
func warmFrom(tr *Trace, opts Options) int {
	return opts.Sizing.MinSamples + reportSteps(tr, opts)
}

func reportSteps(tr *Trace, opts Options) int {
	return max(1, int(opts.Report.Seconds()/tr.StepSeconds+0.5))
}

func roundUp(v, step int64) int64 { return (v + step - 1) / step * step }

// Run replays the trace online against each strategy: whole (a GPU per container), human
// (each container's true peak rounded up to 8 GiB, known in advance), initial (fgpu Initial:
// the container asks a whole GPU, and only a start after an out-of-memory is sized, at the
// recommendation), auto-per-claim (Initial, and containers restarted larger as their use
// nears their cap or smaller when it stays far below it, caps never over-committed), auto
// (fgpu Auto through the allocator's sizing engine: see Auto) and oracle (each container at its true peak, all
// repacked perfectly at every step: first-fit decreasing). A cap violation is a step at
// which a container's use passes its cap: it runs out of memory and restarts larger.
func Run(tr *Trace, opts Options, progress func(done, total int)) []Result {
	peak := make([]int64, len(tr.Containers))
	for i, c := range tr.Containers {
		for _, m := range c.Memory {
			peak[i] = max(peak[i], m)
		}
	}
	fixed := func(name string, size func(i int) int64) Result {
		p := &pool{capacity: opts.GPUMemory}
		f := &figures{Result: Result{Strategy: name}, warmFrom: warmFrom(tr, opts)}
		where := map[int]int{}
		for t := 0; t < tr.Steps; t++ {
			active := 0
			for i, c := range tr.Containers {
				switch {
				case t == c.Start:
					where[i] = p.place(min(size(i), opts.GPUMemory))
				case t == c.Start+len(c.Memory):
					p.remove(where[i], min(size(i), opts.GPUMemory))
				}
				if t >= c.Start && t < c.Start+len(c.Memory) {
					active++
					if c.Memory[t-c.Start] > size(i) {
						f.Violations++
					}
				}
			}
			f.step(p.inUse(), active)
		}
		return f.done(tr.StepSeconds)
	}
	var out []Result
	out = append(out, fixed("whole", func(int) int64 { return opts.GPUMemory }))
	out = append(out, fixed("human", func(i int) int64 { return max(8<<30, roundUp(peak[i], 8<<30)) }))
	out = append(out, adaptive(tr, opts, "initial", false, progress))
	out = append(out, AutoPerClaim(tr, opts, progress))
	out = append(out, Auto(tr, opts, progress))
	out = append(out, oracle(tr, opts, peak))
	return out
}

// AutoPerClaim replays the trace under per-claim Auto: a cap per container, never
// over-committed.
func AutoPerClaim(tr *Trace, opts Options, progress func(done, total int)) Result {
	return adaptive(tr, opts, "auto-per-claim", true, progress)
}

type running struct {
	cap int64
	g   int
	// pods counts the pods it ran as: each is a share of its own.
	id   string
	pods int
	// interval gathers its use since the last report.
	interval sizing.Window
}

func (r *running) share() string { return fmt.Sprintf("%s/%d", r.id, r.pods) }

// adaptive is fgpu Initial (auto false) or per-claim Auto, whose decisions are the
// allocator's sizing engine's (engine.Resizer): a cap per container, never over-committed.
// Running out of memory restarts a container at once (its next step); the recommender and
// Auto see its use only in each report interval's summary.
func adaptive(tr *Trace, opts Options, name string, auto bool, progress func(done, total int)) Result {
	p := &pool{capacity: opts.GPUMemory}
	f := &figures{Result: Result{Strategy: name}, warmFrom: warmFrom(tr, opts)}
	rec := sizing.NewRecommender(opts.Sizing)
	resizer := engine.NewResizer(opts.Sizing.Headroom, opts.ShrinkAfter)
	state := map[int]*running{}
	t0 := time.Unix(0, 0)
	step := time.Duration(tr.StepSeconds * float64(time.Second))
	report := reportSteps(tr, opts)
	resize := func(r *running, size int64) {
		p.remove(r.g, r.cap)
		r.cap = min(opts.GPUMemory, roundUp(size, sizing.MemoryStep))
		r.g = p.place(r.cap)
		resizer.ForgetShare(r.share())
		r.pods++
	}
	grown := func(use int64) int64 { return int64(float64(use) * (1 + opts.Sizing.Headroom)) }
	for t := 0; t < tr.Steps; t++ {
		active := 0
		now := t0.Add(time.Duration(t) * step)
		for i, c := range tr.Containers {
			w := api.SizingWorkload{Name: c.ID, Request: "gpu"}
			switch {
			case t == c.Start:
				r := &running{cap: opts.GPUMemory, id: c.ID}
				r.g = p.place(r.cap)
				state[i] = r
			case t == c.Start+len(c.Memory):
				p.remove(state[i].g, state[i].cap)
				delete(state, i)
			}
			r := state[i]
			if r == nil {
				continue
			}
			active++
			use := c.Memory[t-c.Start]
			r.interval.Add(sizing.Sample{At: now, MemoryBytes: use, SMPercent: c.SM[t-c.Start]})
			if use > r.cap {
				f.Violations++
				want, _ := rec.Recommend(w)
				resize(r, max(want.MemoryBytes, grown(use)))
			}
			if (t+1)%report != 0 {
				continue
			}
			u, _ := r.interval.Summary()
			r.interval.Reset()
			rec.Add(w, c.ID, u)
			if !auto {
				continue
			}
			want, ready := rec.Recommend(w)
			d := resizer.Decide(engine.Report{Workload: w, Share: r.share(), Usage: u, Cap: r.cap, GPUMemory: opts.GPUMemory,
				// The allocator places a busy workload's pod on the whole GPU it asked for.
				ComesBackWhole: func(rec api.SizingRecommendation) bool {
					return r.cap >= opts.GPUMemory && rec.ComputePercent >= engine.BusyComputePercent
				}}, want, ready)
			switch d.Resize {
			case engine.Grow:
				f.Restarts++
				resize(r, d.Want)
			case engine.Shrink:
				f.Restarts++
				resize(r, d.Rec.MemoryBytes)
			}
		}
		f.step(p.inUse(), active)
		if progress != nil && t%100 == 0 {
			progress(t, tr.Steps)
		}
	}
	return f.done(tr.StepSeconds)
}

// oracle packs the running containers' true peaks first-fit decreasing at every step.
func oracle(tr *Trace, opts Options, peak []int64) Result {
	f := &figures{Result: Result{Strategy: "oracle"}, warmFrom: warmFrom(tr, opts)}
	for t := 0; t < tr.Steps; t++ {
		var sizes []int64
		for i, c := range tr.Containers {
			if t >= c.Start && t < c.Start+len(c.Memory) {
				sizes = append(sizes, peak[i])
			}
		}
		sort.Slice(sizes, func(a, b int) bool { return sizes[a] > sizes[b] })
		var bins []int64
		for _, s := range sizes {
			placed := false
			for b := range bins {
				if bins[b] >= s {
					bins[b] -= s
					placed = true
					break
				}
			}
			if !placed {
				bins = append(bins, opts.GPUMemory-s)
			}
		}
		f.step(len(bins), len(sizes))
	}
	return f.done(tr.StepSeconds)
}
