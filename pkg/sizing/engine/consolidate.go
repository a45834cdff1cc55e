package engine

import (
	"slices"
	"time"
)

// Consolidation: bursting shares are placed where their workloads' use fits when their pods
// start, but pods come and go, and GPUs empty unevenly. Each report interval the GPU
// guaranteed least whose bursting tenants would each be placed, one per GPU, on another GPU
// in use is emptied; one GPU at a time.

const (
	// ConsolidateCandidates: a pass tries this many GPUs, those guaranteed least first.
	ConsolidateCandidates = 8
	// DrainGiveUp: a drain that has not emptied its GPU in this long (a PodDisruptionBudget
	// that never allows an eviction) ends, and the GPU is left alone for as long.
	DrainGiveUp = time.Hour
)

// Candidate is a GPU in use whose tenants all burst, with the memory they are guaranteed.
type Candidate[G comparable] struct {
	GPU        G
	Guaranteed int64
}

// Candidates are the GPUs a consolidation pass tries, in turn: the ConsolidateCandidates
// guaranteed least, those guaranteed as much in the order given.
func Candidates[G comparable](all []Candidate[G]) []G {
	slices.SortStableFunc(all, func(a, b Candidate[G]) int {
		switch {
		case a.Guaranteed < b.Guaranteed:
			return -1
		case a.Guaranteed > b.Guaranteed:
			return 1
		}
		return 0
	})
	out := make([]G, 0, min(len(all), ConsolidateCandidates))
	for _, c := range all[:min(len(all), ConsolidateCandidates)] {
		out = append(out, c.GPU)
	}
	return out
}

// Assign finds for each of n tenants of a GPU to empty another GPU among others, one tenant
// per GPU, each the first in others not yet taken that fits says takes it; ok is false where
// one has none.
func Assign[G comparable](n int, others []G, fits func(tenant int, to G) bool) (to []G, ok bool) {
	taken := map[G]bool{}
	to = make([]G, 0, n)
	for i := range n {
		found := false
		for _, g := range others {
			if !taken[g] && fits(i, g) {
				taken[g], found = true, true
				to = append(to, g)
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	return to, true
}
