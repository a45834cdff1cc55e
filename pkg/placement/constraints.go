package placement

import (
	"fmt"
	"slices"
)

// A request's Together and Apart (DRA's matchAttribute and distinctAttribute) are
// correctness, not preference, so every policy gets them: a node qualifies only where its
// usable GPUs can meet them, and the policy scores it with its usable GPUs narrowed to
// those that do. They depend on the node, not on its state, so a constrained request
// takes the filtered path (filtered.go); narrowing keeps a subset of the usable GPUs, so
// a state's score still bounds its nodes' where subsetBound holds.

// constrained reports whether r's GPUs are bound by Together or Apart.
func (r *Request) constrained() bool {
	return r.GPUs > 0 && (r.Together != nil || r.Apart != nil)
}

// constrain narrows s.elig, node ni's usable GPUs for r, to GPUs that meet r's
// constraints: first to Together's group that fits r.GPUs best (the one that holds the
// fewest, counting its GPUs in distinct Apart groups where both are set; ties to the
// group of the lowest GPU), then to one GPU per Apart group (the one leastCrowded ranks
// first, so the node's wiring is broken up least). Where the node cannot meet them it
// reports false, and notes it for whyNot.
func (s *Scheduler) constrain(ni int, r *Request) bool {
	k := r.GPUs
	elig := s.elig[:0]
	s.tg, s.ag = s.tg[:0], s.ag[:0]
	for _, g := range s.elig {
		t, a := 0, g // unset: one group for Together, a group per GPU for Apart
		if r.Together != nil {
			t = r.Together(ni, g)
		}
		if r.Apart != nil {
			a = r.Apart(ni, g)
		}
		if t < 0 || a < 0 {
			continue
		}
		elig = append(elig, g)
		s.tg, s.ag = append(s.tg, t), append(s.ag, a)
	}
	if r.Together != nil && k > 1 {
		best, most := -1, 0
		for i, t := range s.tg {
			if slices.Contains(s.tg[:i], t) {
				continue
			}
			if m := s.apartIn(i); m >= k && (best < 0 || m < most) {
				best, most = i, m
			}
		}
		if best < 0 {
			s.unmet = true
			return false
		}
		t, kept := s.tg[best], 0
		for i, g := range elig {
			if s.tg[i] == t {
				elig[kept], s.ag[kept] = g, s.ag[i]
				kept++
			}
		}
		elig, s.ag = elig[:kept], s.ag[:kept]
	}
	if r.Apart != nil && k > 1 {
		s.c.mark(ni, elig)
		reps := s.reps[:0]
		for i, a := range s.ag {
			if slices.Contains(s.ag[:i], a) {
				continue
			}
			members := s.members[:0]
			for j := i; j < len(elig); j++ {
				if s.ag[j] == a {
					members = append(members, elig[j])
				}
			}
			s.members = members
			reps = append(reps, s.c.leastCrowded(ni, members))
		}
		slices.Sort(reps)
		s.reps = reps
		elig = append(elig[:0], reps...)
	}
	s.elig = elig
	if len(elig) < k {
		s.unmet = true
		return false
	}
	return true
}

// apartIn counts the Apart groups among the GPUs of s.elig in the Together group of
// s.elig[i], i being its first.
func (s *Scheduler) apartIn(i int) int {
	m := 0
	for j := i; j < len(s.tg); j++ {
		if s.tg[j] != s.tg[i] {
			continue
		}
		seen := false
		for h := i; h < j && !seen; h++ {
			seen = s.tg[h] == s.tg[i] && s.ag[h] == s.ag[j]
		}
		if !seen {
			m++
		}
	}
	return m
}

// unmetError is the error of a request that some node had room for but none could meet
// its constraints on.
func unmetError(r *Request) error {
	var d string
	switch {
	case r.Together != nil && r.Apart != nil:
		d = fmt.Sprintf("no node has %d usable GPUs in one group of the match constraint, each in a different group of the distinct constraint", r.GPUs)
	case r.Together != nil:
		d = fmt.Sprintf("no node has %d usable GPUs in one group of the match constraint", r.GPUs)
	case r.GPUs > 1:
		d = fmt.Sprintf("no node has %d usable GPUs in different groups of the distinct constraint", r.GPUs)
	default:
		d = "no usable GPU is in a group of the constraint"
	}
	return &UnplaceableError{Request: r.Name, Reason: ReasonConstraint, Detail: d}
}
