package sim

import (
	"math"
	"runtime"
	"sort"
	"sync"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Summary aggregates replays over seeds; percentages are of cluster GPUs.
type Summary struct {
	Policy        string  `json:"policy"`
	Workload      string  `json:"workload"`
	Seeds         []int64 `json:"seeds"`
	Tune          float64 `json:"tune"`
	Batch         int     `json:"batch"`
	Orders        int     `json:"orders,omitempty"`
	TopologyBlind bool    `json:"topology_blind,omitempty"` // the policy saw no wiring (Config.TopologyBlind)
	AllocAt100    float64 `json:"gpu_alloc_ratio_at_100"`
	AllocAt100Std float64 `json:"gpu_alloc_ratio_at_100_std"`
	AllocAt130    float64 `json:"gpu_alloc_ratio_at_130"`
	AllocAt130Std float64 `json:"gpu_alloc_ratio_at_130_std"`
	Unallocated   float64 `json:"unallocated_gpus_at_130"`
	// The unallocated GPUs split into whole ones and the free share of
	// partly used ones; RepackBound (percent, 0 when unknown) is the mean of
	// Waste.RepackAlloc: what no placement of the same admitted fractional
	// pods can beat.
	UnallocWhole   float64            `json:"unallocated_whole_gpus_at_130"`
	UnallocPartial float64            `json:"unallocated_partial_gpus_at_130"`
	RepackBound    float64            `json:"repack_bound_at_130,omitempty"`
	P50us          float64            `json:"decision_us_p50"`
	P99us          float64            `json:"decision_us_p99"`
	MaxUs          float64            `json:"decision_us_max"`
	Wall           float64            `json:"wall_seconds"`
	FailedGPUs     map[string]float64 `json:"failed_gpu_demand"`
	FailedPods     map[string]float64 `json:"failed_pods"`
	Reasons        map[string]int     `json:"failure_reasons"`
	Curve          []CurvePoint       `json:"curve"`
	// Locality is where the placed multi-GPU pods' GPUs lie in the
	// topology model (topology.go).
	Locality LocalitySummary `json:"multi_gpu_locality"`
}

// LocalitySummary is Locality's counts as means per seed, and the percent
// of the pods with room in one island (root) that got one (0 when none
// had room).
type LocalitySummary struct {
	Pods        float64 `json:"placed"`
	IslandRoom  float64 `json:"island_room"`
	InIsland    float64 `json:"in_one_island"`
	InIslandPct float64 `json:"in_one_island_pct"`
	RootRoom    float64 `json:"pcie_root_room"`
	InRoot      float64 `json:"in_one_pcie_root"`
	InRootPct   float64 `json:"in_one_pcie_root_pct"`
}

// CurvePoint is the mean (and std over seeds) allocation ratio, in percent,
// once arrived demand reached ArrivedPct percent of capacity.
type CurvePoint struct {
	ArrivedPct float64 `json:"arrived_pct"`
	AllocPct   float64 `json:"alloc_pct"`
	StdPct     float64 `json:"std_pct"`
}

// RunSeeds replays cfg once per seed, in parallel, and summarises. progress,
// if set, is called after each finished seed.
func RunSeeds(cfg Config, seeds []int64, progress func(done, total int)) (*Summary, []*Result, error) {
	t0 := time.Now()
	results := make([]*Result, len(seeds))
	errs := make([]error, len(seeds))
	var wg sync.WaitGroup
	par := cfg.Parallel
	if par <= 0 {
		par = runtime.GOMAXPROCS(0)
	}
	sem := make(chan struct{}, par)
	var mu sync.Mutex
	done := 0
	for i, seed := range seeds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			c := cfg
			c.Seed = seed
			results[i], errs[i] = Run(c)
			if progress != nil {
				mu.Lock()
				done++
				progress(done, len(seeds))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, nil, err
		}
	}
	s := Summarize(cfg, seeds, results)
	s.Wall = time.Since(t0).Seconds()
	return s, results, nil
}

// Summarize aggregates per-seed results.
func Summarize(cfg Config, seeds []int64, results []*Result) *Summary {
	s := &Summary{Policy: cfg.Policy, Seeds: seeds, Tune: cfg.Tune, Batch: max(cfg.Batch, 1), TopologyBlind: cfg.TopologyBlind,
		FailedGPUs: map[string]float64{}, FailedPods: map[string]float64{}, Reasons: map[string]int{}}
	if s.Batch > 1 {
		s.Orders = cfg.Orders
		if s.Orders <= 0 {
			s.Orders = placement.BatchOrders
		}
	}
	n := float64(len(results))
	var capa int64
	for _, nd := range cfg.Nodes {
		capa += int64(len(nd.GPUs))
	}
	at := func(x float64) (mean, std float64) {
		v := make([]float64, len(results))
		for i, r := range results {
			v[i] = 100 * r.AllocAt(x)
		}
		return meanStd(v)
	}
	s.AllocAt100, s.AllocAt100Std = at(1.0)
	s.AllocAt130, s.AllocAt130Std = at(cfg.Tune)
	s.Unallocated = float64(capa) * (1 - s.AllocAt130/100)
	var durs []float64
	bounded := true
	for _, r := range results {
		s.UnallocWhole += r.Waste.WholeGPUs / n
		s.UnallocPartial += r.Waste.PartialGPUs / n
		s.RepackBound += 100 * r.Waste.RepackAlloc / n
		bounded = bounded && r.Waste.RepackGPUs >= 0
		l := &s.Locality
		l.Pods += float64(r.Locality.Pods) / n
		l.IslandRoom += float64(r.Locality.IslandRoom) / n
		l.InIsland += float64(r.Locality.InIsland) / n
		l.RootRoom += float64(r.Locality.RootRoom) / n
		l.InRoot += float64(r.Locality.InRoot) / n
		for c := Class(0); c < numClasses; c++ {
			s.FailedGPUs[c.String()] += float64(r.FailedMilli[c]) / 1000 / n
			s.FailedPods[c.String()] += float64(r.Failed[c]) / n
		}
		for k, v := range r.Reasons {
			s.Reasons[k] += v
		}
		for _, d := range r.Decisions {
			durs = append(durs, float64(d.Nanoseconds())/1000)
		}
	}
	if !bounded {
		s.RepackBound = 0
	}
	s.Locality.InIslandPct = percent(s.Locality.InIsland, s.Locality.IslandRoom)
	s.Locality.InRootPct = percent(s.Locality.InRoot, s.Locality.RootRoom)
	sort.Float64s(durs)
	if len(durs) > 0 {
		s.P50us = durs[len(durs)/2]
		s.P99us = durs[min(len(durs)-1, int(float64(len(durs))*0.99))]
		s.MaxUs = durs[len(durs)-1]
	}
	step := cfg.Step
	if step <= 0 {
		step = 0.1
	}
	for x := step; x <= cfg.Tune+1e-9; x += step {
		m, sd := at(x)
		s.Curve = append(s.Curve, CurvePoint{ArrivedPct: math.Round(x * 100), AllocPct: m, StdPct: sd})
	}
	return s
}

// percent is 100 a/b, 0 when b is (JSON has no NaN).
func percent(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return 100 * a / b
}

func meanStd(v []float64) (mean, std float64) {
	if len(v) == 0 {
		return 0, 0
	}
	for _, x := range v {
		mean += x
	}
	mean /= float64(len(v))
	for _, x := range v {
		std += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(std / float64(len(v)))
}
