package placement

import (
	"slices"
)

// A request with a Filter (the allocator's: pod fit, device selectors, tenancy, quota)
// may have nodes or GPUs of one state turned down, so the nodes of a state are no longer
// alike. The index still bounds what a state's nodes can score: a node keeps some of the
// state's usable GPUs, and for the policies and requests where subsetBound holds, no
// subset of a node's usable GPUs scores above all of them. So placeFiltered scores each
// candidate state once, unfiltered (its bound), and asks the filter only about the nodes
// that could still win: a state's nodes by name until one keeps every usable GPU (it
// scores the bound, and the later ones can at best tie with a larger name), and no node
// of a state whose bound is below the best found (or equal to it, with a larger name).
// States where the bound does not hold have every node filtered and scored. The best
// node is the one scoring every node would find, and when none is found the filter has
// been asked about exactly the (node, GPU) pairs scoring every node asks about, so a
// filter that counts what it turns down counts the same.

// cand is a state a filtered request may go to, scored on its first node with every
// usable GPU.
type cand struct {
	g        int32
	score    float64
	from, to int32 // the GPUs it picked: gpuBuf[from:to]
	n        int32 // its usable GPUs
	bounded  bool  // subsetBound holds: score bounds every node of the state
	finished bool
}

// subsetBound reports whether node n, scored for r with its usable GPUs elig, scores at
// least as high with every elig as with any subset of them (of r.GPUs or more).
func (s *Scheduler) subsetBound(n int, r *Request, elig []int) bool {
	if r.GPUs == 0 {
		return true // a node-level filter: no GPU is chosen
	}
	return s.ss.subsetBound(s.c, n, r, elig)
}

// placeFiltered is Place's search for a request with a Filter, or with constraints
// (constraints.go), over the state index.
func (s *Scheduler) placeFiltered(r *Request, mask uint64) {
	x := &s.c.states
	s.cands, s.short, s.gpuBuf = s.cands[:0], s.short[:0], s.gpuBuf[:0]
	kept, stamp := s.kept.forShape(scoreShape{cpu: r.CPUMilli, mem: r.MemoryMiB, share: r.Share, gpus: r.GPUs, mask: mask}, len(x.groups))
	add := func(g int32) {
		k := &kept[g]
		var gpus []int
		if k.gen == x.groups[g].gen && k.stamp == stamp {
			s.cand = s.cand[:0]
			for _, gi := range k.gpus[:k.ngpus] {
				s.cand = append(s.cand, int(gi))
			}
			gpus = s.cand
		} else {
			gpus = s.outcome(g, r, mask, k, stamp)
		}
		switch k.kind {
		case outShort:
			s.short = append(s.short, g)
		case outCand:
			from := len(s.gpuBuf)
			s.gpuBuf = append(s.gpuBuf, gpus...)
			s.cands = append(s.cands, cand{g: g, score: k.score, from: int32(from), to: int32(len(s.gpuBuf)), n: k.n, bounded: k.bounded})
		}
	}
	if r.GPUs > 0 {
		lo := int32(freeBuckets)
		if !r.Whole() {
			lo = freeBucket(r.Share)
		}
		for b := lo; b < freeBuckets; b++ {
			for _, g := range x.byFree[b] {
				add(g)
			}
		}
		for _, g := range x.whole {
			if x.groups[g].bucket < lo {
				add(g)
			}
		}
	} else {
		for _, g := range x.live {
			add(g)
		}
		for _, g := range x.spent {
			add(g)
		}
	}
	// The best bound first: where its first node passes, no bounded state is left to walk.
	if top := s.bestCand(); top >= 0 {
		s.walk(r, mask, &s.cands[top])
	}
	rest := s.rest[:0]
	for i := range s.cands {
		if !s.cands[i].finished && !s.beaten(&s.cands[i], x.groups[s.cands[i].g].first) {
			rest = append(rest, i)
		}
	}
	s.rest = rest
	slices.SortFunc(rest, func(a, b int) int { return s.candOrder(&s.cands[a], &s.cands[b]) })
	for _, i := range rest {
		s.walk(r, mask, &s.cands[i])
	}
	if s.pick.node >= 0 {
		return
	}
	if r.Filter == nil {
		return // constrained only
	}
	// Nothing fits: ask the filter about the GPUs of the states short of GPUs too, as
	// scoring every node does.
	for _, g := range s.short {
		for _, ni := range x.groups[g].members {
			for gi := range s.c.nodes[ni].gpuFree {
				if s.c.fits(int(ni), gi, r, mask) {
					r.Filter(int(ni), gi)
				}
			}
		}
	}
}

// outcome scores state g for r, unfiltered, on its first node, into k (valid under
// stamp), and returns the GPUs it picked where k is a candidate. k is kept for the next
// request of r's shape unless it picked more GPUs, or GPUs further down the node, than it
// has room for.
func (s *Scheduler) outcome(g int32, r *Request, mask uint64, k *stateScore, stamp uint64) []int {
	x := &s.c.states
	*k = stateScore{kind: outSkip, gen: x.groups[g].gen, stamp: stamp}
	ni := int(x.groups[g].first)
	n := &s.c.nodes[ni]
	if !n.fitsCPU(r) {
		return nil
	}
	s.all = s.all[:0]
	if r.GPUs > 0 {
		if len(n.gpuFree) < r.GPUs || (mask != 0 && n.models&mask == 0) {
			return nil
		}
		for gi := range n.gpuFree {
			if s.c.fits(ni, gi, r, mask) {
				s.all = append(s.all, gi)
			}
		}
		if len(s.all) == 0 {
			return nil
		}
		if len(s.all) < r.GPUs {
			k.kind = outShort
			return nil
		}
	}
	score, gpus := s.p.Score(s.c, ni, r, s.all, s.cand[:0])
	s.cand = gpus
	s.scored++
	k.kind, k.score, k.n, k.bounded = outCand, score, int32(len(s.all)), s.subsetBound(ni, r, s.all)
	if len(gpus) > maxKeptGPUs {
		k.gen = 0 // no group has generation 0: scored again next time
		return gpus
	}
	for i, gi := range gpus {
		if gi > 127 {
			k.gen = 0
			return gpus
		}
		k.gpus[i] = int8(gi)
	}
	k.ngpus = uint8(len(gpus))
	return gpus
}

// candOrder orders states by bound, highest first, then by their first node's name.
func (s *Scheduler) candOrder(a, b *cand) int {
	switch {
	case a.score > b.score:
		return -1
	case a.score < b.score:
		return 1
	}
	x := &s.c.states
	return int(x.rank[x.groups[a.g].first] - x.rank[x.groups[b.g].first])
}

// bestCand is the state with the best bound (-1: none).
func (s *Scheduler) bestCand() int {
	best := -1
	for i := range s.cands {
		if best < 0 || s.candOrder(&s.cands[i], &s.cands[best]) < 0 {
			best = i
		}
	}
	return best
}

// beaten reports whether node ni of bounded state c, and every node of c after it by
// name, can do no better than the best node found so far.
func (s *Scheduler) beaten(c *cand, ni int32) bool {
	b := &s.pick
	if !c.bounded || b.node < 0 {
		return false
	}
	rank := s.c.states.rank
	return c.score < b.score || (c.score == b.score && rank[ni] > rank[b.node])
}

// walk filters and scores the nodes of state c by name, as far as one of them could win.
func (s *Scheduler) walk(r *Request, mask uint64, c *cand) {
	c.finished = true
	for _, ni := range s.c.states.groups[c.g].members {
		if s.beaten(c, ni) {
			return
		}
		s.elig = s.elig[:0]
		if r.GPUs > 0 {
			for gi := range s.c.nodes[ni].gpuFree {
				if s.c.usable(int(ni), gi, r, mask) {
					s.elig = append(s.elig, gi)
				}
			}
			if len(s.elig) < r.GPUs || (r.constrained() && !s.constrain(int(ni), r)) {
				continue
			}
		} else if r.Filter != nil && !r.Filter(int(ni), -1) {
			continue
		}
		if len(s.elig) == int(c.n) {
			// Every usable GPU: the state's own score and GPUs.
			s.cand = append(s.cand[:0], s.gpuBuf[c.from:c.to]...)
			s.offer(int(ni), c.score, s.cand)
			if c.bounded {
				return
			}
			continue
		}
		s.consider1(int(ni), r)
	}
}

// consider1 scores node ni for r with the GPUs in s.elig and offers it.
func (s *Scheduler) consider1(ni int, r *Request) {
	score, gpus := s.p.Score(s.c, ni, r, s.elig, s.cand[:0])
	s.cand = gpus
	s.scored++
	s.offer(ni, score, gpus)
}
