// Package binpack solves the LP relaxation of packing GPU shares into GPUs
// (the cutting-stock LP, by Gilmore-Gomory column generation on gonum's
// simplex). It gives a lower bound on the GPUs a set of fractional pods
// needs, and the LP's prices: what one pod of each share is worth in GPUs
// when GPUs are packed as well as possible.
package binpack

import (
	"math"
	"sort"

	"gonum.org/v1/gonum/mat"
	"gonum.org/v1/gonum/optimize/convex/lp"
)

// maxPatterns bounds the column generation; past it the bound still holds,
// it is only less tight (Farley's bound), and the prices are those reached.
const maxPatterns = 400

// maxSizes bounds the distinct shares the LP sees: past it, shares are
// rounded down to multiples of capa/maxSizes. Rounding down keeps the bound
// a bound; it is only looser. (openb has 20-25 distinct shares; 100 took
// 30 s to solve.)
const maxSizes = 32

// Solution is the LP relaxation for one multiset of shares.
type Solution struct {
	// Sizes are the distinct shares, largest first; Price[i] is the dual
	// price of one item of Sizes[i], in GPUs.
	Sizes []int64
	Price []float64
	// Bound is a lower bound on the LP optimum (GPUs, fractional).
	Bound float64
}

// Solve runs column generation for counts (share -> how many) on GPUs of
// capacity capa. Shares above capa are clamped to it; non-positive ones are
// ignored.
func Solve(counts map[int64]float64, capa int64) Solution {
	merged := map[int64]float64{}
	var sum float64
	for s, n := range counts {
		if s > 0 && n > 0 {
			merged[min(s, capa)] += n
			sum += n * float64(min(s, capa))
		}
	}
	if len(merged) > maxSizes {
		step := max(capa/maxSizes, 1)
		coarse := map[int64]float64{}
		for s, n := range merged {
			coarse[max(s/step*step, 1)] += n
		}
		merged = coarse
	}
	var sol Solution
	for s := range merged {
		sol.Sizes = append(sol.Sizes, s)
	}
	sort.Slice(sol.Sizes, func(i, j int) bool { return sol.Sizes[i] > sol.Sizes[j] })
	sol.Bound = sum / float64(capa)
	sol.Price = make([]float64, len(sol.Sizes))
	if len(sol.Sizes) == 0 {
		return sol
	}
	demand := make([]float64, len(sol.Sizes))
	for i, s := range sol.Sizes {
		demand[i] = merged[s]
	}
	// Start from one pattern per size: as many copies as fit.
	var patterns [][]float64
	for i, s := range sol.Sizes {
		p := make([]float64, len(sol.Sizes))
		p[i] = math.Min(float64(capa/s), math.Ceil(demand[i]))
		patterns = append(patterns, p)
	}
	for len(patterns) <= maxPatterns {
		y, obj, ok := dualPrices(patterns, demand)
		if !ok {
			break
		}
		sol.Price = y
		p, value := bestPattern(sol.Sizes, demand, y, capa)
		// Farley: obj/value is a lower bound on the LP optimum at any step.
		sol.Bound = math.Max(sol.Bound, obj/math.Max(value, 1))
		if value <= 1+1e-9 {
			break
		}
		patterns = append(patterns, p)
	}
	return sol
}

// MinGPUs is a lower bound on how many GPUs of capacity capa it takes to
// hold the given shares, whatever the placement: the LP bound rounded up.
// It ignores CPU, memory and node boundaries, so no placement of the same
// shares frees more GPUs than the ones in use minus this bound.
func MinGPUs(shares []int64, capa int64) int {
	counts := map[int64]float64{}
	for _, s := range shares {
		counts[s]++
	}
	return int(math.Ceil(Solve(counts, capa).Bound - 1e-6))
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
// that fits one GPU, using at most demand[i] (rounded up) items of size i.
func bestPattern(sizes []int64, demand, price []float64, capa int64) ([]float64, float64) {
	value := make([]float64, capa+1)
	// take[i][c]: items of size i taken at capacity c in the optimum.
	take := make([][]int, len(sizes))
	prev := make([]float64, capa+1)
	for i, s := range sizes {
		copy(prev, value)
		take[i] = make([]int, capa+1)
		limit := min(int64(math.Ceil(demand[i])), capa/s)
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

// Values returns, for every free share g in 0..capa, the most LP price that
// fits in g (items may repeat): what a gap of g is worth when filled as well
// as the priced sizes allow.
func (s Solution) Values(capa int64) []float64 {
	v := make([]float64, capa+1)
	for g := int64(1); g <= capa; g++ {
		v[g] = v[g-1]
		for i, sz := range s.Sizes {
			if sz <= g {
				v[g] = math.Max(v[g], v[g-sz]+s.Price[i])
			}
		}
	}
	return v
}
