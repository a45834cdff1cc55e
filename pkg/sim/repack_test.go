package sim

import (
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

func TestRepackBound(t *testing.T) {
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
		if got := RepackBound(tc.shares, 1000); got != tc.want {
			t.Errorf("%s: RepackBound = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The bound never exceeds what best-fit-decreasing achieves and never falls
// below the share sum.
func TestRepackBoundBetweenSumAndBestFit(t *testing.T) {
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
		got := RepackBound(shares, 1000)
		if lo, hi := int((sum+999)/1000), bestFitDecreasing(shares, 1000); got < lo || got > hi {
			t.Fatalf("RepackBound = %d, want within [%d, %d] for %v", got, lo, hi, shares)
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
