package sim

import (
	"math"
	"sort"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// maxPatterns bounds the column generation; past it the bound still holds,
// it is only less tight (Farley's bound).
const maxPatterns = 400

// RepackBound is a lower bound on how many GPUs of capacity capa it takes to
// hold the given fractional shares, whatever the placement: the
// cutting-stock LP relaxation (Gilmore-Gomory column generation), rounded up.
// It ignores CPU, memory and node boundaries, so no placement of the same
// shares frees more GPUs than the ones in use minus this bound. It tells the
// loss a better placement could still recover from the loss that comes with
// the pods admitted (a lone 810m pod's 190m sliver).
func RepackBound(shares []int64, capa int64) int {
	counts := map[int64]int{}
	var sum int64
	for _, s := range shares {
		if s <= 0 {
			continue
		}
		counts[min(s, capa)]++
		sum += min(s, capa)
	}
	trivial := int((sum + capa - 1) / capa)
	if len(counts) == 0 {
		return 0
	}
	sizes := make([]int64, 0, len(counts))
	for s := range counts {
		sizes = append(sizes, s)
	}
	sort.Slice(sizes, func(i, j int) bool { return sizes[i] > sizes[j] })
	demand := make([]float64, len(sizes))
	for i, s := range sizes {
		demand[i] = float64(counts[s])
	}
	// Start from one pattern per size: as many copies as fit.
	var patterns [][]float64
	for i, s := range sizes {
		p := make([]float64, len(sizes))
		p[i] = math.Min(float64(capa/s), demand[i])
		patterns = append(patterns, p)
	}
	best := float64(trivial)
	for len(patterns) <= maxPatterns {
		y, obj, ok := dualPrices(patterns, demand)
		if !ok {
			break
		}
		p, value := bestPattern(sizes, counts, y, capa)
		// Farley: obj/value is a lower bound on the LP optimum at any step.
		best = math.Max(best, obj/math.Max(value, 1))
		if value <= 1+1e-9 {
			break
		}
		patterns = append(patterns, p)
	}
	return max(trivial, int(math.Ceil(best-1e-6)))
}

// dualPrices solves the dual of the restricted master LP
// (max demand·y s.t. pattern·y <= 1 for every pattern, y >= 0): the price of
// one item of each size.
func dualPrices(patterns [][]float64, demand []float64) (y []float64, obj float64, ok bool) {
	m, n := len(demand), len(patterns)
	a := mat.NewDense(n, m+n, nil)
	b := make([]float64, n)
	c := make([]float64, m+n)
	for j, p := range patterns {
		for i, v := range p {
			a.Set(j, i, v)
		}
		a.Set(j, m+j, 1)
		b[j] = 1
	}
	for i, d := range demand {
		c[i] = -d
	}
	opt, x, err := lp.Simplex(c, a, b, 1e-10, nil)
	if err != nil {
		return nil, 0, false
	}
	return x[:m], -opt, true
}

// bestPattern is the bounded knapsack: the pattern of the most total price
// that fits one GPU, using at most counts[size] items of each size.
func bestPattern(sizes []int64, counts map[int64]int, price []float64, capa int64) ([]float64, float64) {
	value := make([]float64, capa+1)
	// take[i][c]: items of size i taken at capacity c in the optimum.
	take := make([][]int, len(sizes))
	prev := make([]float64, capa+1)
	for i, s := range sizes {
		copy(prev, value)
		take[i] = make([]int, capa+1)
		limit := min(int64(counts[s]), capa/s)
		for c := capa; c >= 0; c-- {
			for k := int64(1); k <= limit && k*s <= c; k++ {
				if v := prev[c-k*s] + float64(k)*price[i]; v > value[c]+1e-12 {
					value[c], take[i][c] = v, int(k)
				}
			}
		}
	}
	p := make([]float64, len(sizes))
	c := capa
	for i := len(sizes) - 1; i >= 0; i-- {
		p[i] = float64(take[i][c])
		c -= int64(take[i][c]) * sizes[i]
	}
	return p, value[capa]
}
