package placement

import (
	"math"
	"slices"

	"github.com/fgpu-dev/fgpu/pkg/binpack"
)

// lpLoss prices GPU shares with the cutting-stock LP over a workload's
// sharing shapes and says what a placement loses against the best packing:
// putting share s on a GPU with h free loses value(h) - price(s) -
// value(h-s), where value(g) is the most price that fits in a gap of g.
type lpLoss struct {
	price map[int64]float64
	// steps are ascending CPU amounts, vals[i] the gap values using only
	// the shares whose smallest pod needs at most steps[i] CPU. Without CPU
	// awareness there is one step that every node passes.
	steps []int64
	vals  [][]float64
}

// newLPLoss solves the LP for w's sharing shapes, their weights scaled to
// many pods so that it describes the steady mix. byCPU makes a gap worth
// only what the CPU beside it can host.
func newLPLoss(w Workload, byCPU bool) *lpLoss {
	counts := map[int64]float64{}
	minCPU := map[int64]int64{}
	for _, s := range w {
		if s.GPUs != 1 || s.Share <= 0 || s.Share >= DefaultGPUCapacity {
			continue
		}
		counts[s.Share] += s.Weight * 1e4
		if c, ok := minCPU[s.Share]; !ok || s.CPUMilli < c {
			minCPU[s.Share] = s.CPUMilli
		}
	}
	sol := binpack.Solve(counts, DefaultGPUCapacity)
	l := &lpLoss{price: map[int64]float64{}}
	for i, sz := range sol.Sizes {
		l.price[sz] = sol.Price[i]
	}
	if !byCPU {
		l.steps = []int64{math.MinInt64}
		l.vals = [][]float64{sol.Values(DefaultGPUCapacity)}
		return l
	}
	for _, c := range minCPU {
		l.steps = append(l.steps, c)
	}
	slices.Sort(l.steps)
	l.steps = slices.Compact(l.steps)
	for _, t := range l.steps {
		var sub binpack.Solution
		for i, sz := range sol.Sizes {
			if minCPU[sz] <= t {
				sub.Sizes = append(sub.Sizes, sz)
				sub.Price = append(sub.Price, sol.Price[i])
			}
		}
		l.vals = append(l.vals, sub.Values(DefaultGPUCapacity))
	}
	return l
}

// value is what a gap of h is worth on a node with cpu free CPU.
func (l *lpLoss) value(h, cpu int64) float64 {
	i, _ := slices.BinarySearch(l.steps, cpu+1)
	if i == 0 {
		return 0
	}
	return l.vals[i-1][h]
}

// loss is the LP reduced cost, rounded to 1/1000 GPU, of putting share s on
// a GPU of capacity capa with h free, on a node whose free CPU goes from
// cpuBefore to cpuAfter. A share the workload does not have is priced at
// what the workload's shares could fill in its place.
func (l *lpLoss) loss(h, s, capa, cpuBefore, cpuAfter int64) float64 {
	if capa != DefaultGPUCapacity || len(l.vals) == 0 {
		return 0
	}
	price, ok := l.price[s]
	if !ok {
		price = l.vals[len(l.vals)-1][s]
	}
	return math.Round(max(0, l.value(h, cpuBefore)-price-l.value(h-s, cpuAfter))*1000) / 1000
}
