package binpack

import (
	"math"
	"math/rand"
	"sort"
	"testing"
)

func repeat(n int, share int64) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = share
	}
	return out
}

func TestMinGPUs(t *testing.T) {
	cases := []struct {
		name   string
		shares []int64
		want   int
	}{
		{"empty", nil, 0},
		{"halves pair up", repeat(4, 500), 2},
		{"no two fit together", repeat(3, 600), 3},
		{"810m slivers only take small pods", append(repeat(10, 810), repeat(5, 160)...), 10},
		{"LP above the share sum", append(repeat(3, 600), repeat(3, 450)...), 5},
		{"exact complements", append(repeat(7, 810), repeat(7, 190)...), 7},
	}
	for _, tc := range cases {
		if got := MinGPUs(tc.shares, 1000); got != tc.want {
			t.Errorf("%s: MinGPUs = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The bound never exceeds what best-fit-decreasing achieves and never falls
// below the share sum.
func TestMinGPUsBetweenSumAndBestFit(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	sizes := []int64{810, 650, 590, 550, 470, 460, 320, 230, 160, 110, 50}
	for range 50 {
		var shares []int64
		var sum int64
		for range 20 + rng.Intn(200) {
			s := sizes[rng.Intn(len(sizes))]
			shares = append(shares, s)
			sum += s
		}
		got := MinGPUs(shares, 1000)
		if lo, hi := int((sum+999)/1000), bestFitDecreasing(shares, 1000); got < lo || got > hi {
			t.Fatalf("MinGPUs = %d, want within [%d, %d] for %v", got, lo, hi, shares)
		}
	}
}

func bestFitDecreasing(shares []int64, capa int64) int {
	s := append([]int64(nil), shares...)
	sort.Slice(s, func(i, j int) bool { return s[i] > s[j] })
	var bins []int64
	for _, x := range s {
		best := -1
		for i, b := range bins {
			if b+x <= capa && (best < 0 || b > bins[best]) {
				best = i
			}
		}
		if best < 0 {
			bins = append(bins, x)
		} else {
			bins[best] += x
		}
	}
	return len(bins)
}

// Prices: a share worth one third of a GPU packs three to a GPU or beside
// a share worth two thirds; a gap is worth what fills it best.
func TestPrices(t *testing.T) {
	// More 320m than 650m pods: some 320m pods pack three to a GPU.
	sol := Solve(map[int64]float64{650: 100, 320: 400, 470: 100}, 1000)
	price := map[int64]float64{}
	for i, s := range sol.Sizes {
		price[s] = sol.Price[i]
	}
	if math.Abs(price[650]+price[320]-1) > 1e-6 || math.Abs(2*price[470]-1) > 1e-6 || math.Abs(3*price[320]-1) > 1e-6 {
		t.Errorf("prices %v, want 650+320 = 470+470 = 320x3 = 1 GPU", price)
	}
	v := sol.Values(1000)
	if math.Abs(v[1000]-1) > 1e-6 || math.Abs(v[530]-price[470]) > 1e-6 || v[200] != 0 {
		t.Errorf("values: 1000 -> %.3f, 530 -> %.3f, 200 -> %.3f", v[1000], v[530], v[200])
	}
}

// Arbitrary shares (hundreds of distinct sizes) are rounded down before the
// LP sees them; the bound stays a bound.
func TestMinGPUsManySizes(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	var shares []int64
	var sum int64
	for range 3000 {
		s := 1 + rng.Int63n(999)
		shares = append(shares, s)
		sum += s
	}
	got := MinGPUs(shares, 1000)
	if lo, hi := int((sum+999)/1000), bestFitDecreasing(shares, 1000); got < lo || got > hi {
		t.Fatalf("MinGPUs = %d, want within [%d, %d]", got, lo, hi)
	}
}

// BenchmarkSolve: the LP as fgpu's policy solves it when it is attached
// (openb default's 20 sharing shares) and as fgpu sim solves it per seed.
func BenchmarkSolve(b *testing.B) {
	openb := map[int64]float64{810: 1078, 470: 750, 320: 328, 650: 253, 230: 140, 460: 128,
		590: 75, 160: 74, 550: 72, 220: 62, 370: 47, 110: 24, 480: 19, 50: 7, 330: 7, 350: 6,
		270: 4, 440: 2, 140: 1, 290: 1}
	for b.Loop() {
		Solve(openb, 1000)
	}
}

// A share with less than one pod's worth of demand (a rare shape in a
// workload's weights) is still priced as a pod, not at twice a GPU.
func TestPricesOfRareShares(t *testing.T) {
	sol := Solve(map[int64]float64{500: 100, 250: 0.5}, 1000)
	for i, s := range sol.Sizes {
		if sol.Price[i] > 0.5+1e-9 {
			t.Errorf("price of %dm = %.3f GPU, want at most half a GPU", s, sol.Price[i])
		}
	}
}
