package placement

import (
	"math/rand"
	"strings"
)

// Scheduler places requests on a Cluster with a Policy.
type Scheduler struct {
	c      *Cluster
	p      Policy
	rng    *rand.Rand
	random bool
	elig   []int
	cand   []int
	best   []int
	scored int64
	pick   choice
	// byState: the policy scores nodes by their state alone, so the state
	// index may stand in for the node list (states.go).
	byState bool
	ss      stateScorer // the policy, where byState
	cands   []cand      // placeFiltered's states, scored
	rest    []int       // placeFiltered's states left to walk, by bound
	short   []int32     // placeFiltered's states with too few GPUs for the request
	all     []int       // a state's usable GPUs, unfiltered
	gpuBuf  []int       // the GPUs each of cands picked, end to end
	kept    stateScores // placeFiltered's states' outcomes by request shape
	// constrain's scratch: each GPU's Together and Apart group, an Apart group's
	// GPUs, the GPU kept of each
	tg, ag, members, reps []int
	unmet                 bool // a node with room was turned down by the constraints
}

// NewScheduler binds policy p to cluster c. seed drives random tie-breaking
// for policies that ask for it.
func NewScheduler(c *Cluster, p Policy, seed int64) *Scheduler {
	s := &Scheduler{c: c, rng: rand.New(rand.NewSource(seed))}
	s.attach(p)
	return s
}

// SetPolicy replaces the scheduler's policy (a policy for a workload learned
// since, Learner): the old policy's Cluster.OnChange hooks are dropped and p
// is attached to the cluster as it is now.
func (s *Scheduler) SetPolicy(p Policy) {
	kept := s.c.observers[:0]
	for _, o := range s.c.observers {
		if o.owner != s {
			kept = append(kept, o)
		}
	}
	clear(s.c.observers[len(kept):])
	s.c.observers = kept
	s.attach(p)
}

func (s *Scheduler) attach(p Policy) {
	s.kept.epoch++ // the outcomes kept were the old policy's
	s.c.attaching = s
	p.Attach(s.c)
	s.c.attaching = nil
	s.p = p
	s.random = false
	if rt, ok := p.(RandomTies); ok {
		s.random = rt.RandomTies()
	}
	ss, ok := p.(stateScorer)
	s.byState = ok && ss.scoresByState() && !s.random
	s.ss = ss
}

// Cluster returns the scheduler's cluster.
func (s *Scheduler) Cluster() *Cluster { return s.c }

// Policy returns the scheduler's policy.
func (s *Scheduler) Policy() Policy { return s.p }

// Scored is how many (node, request) scores the policy has computed so far: the
// nodes a decision touched, for benchmarks that count work besides timing it.
func (s *Scheduler) Scored() int64 { return s.scored }

// Place decides where r goes without changing the cluster.
func (s *Scheduler) Place(r *Request) (Placement, error) {
	if r.CPUMilli < 0 || r.MemoryMiB < 0 || r.GPUs < 0 || r.Share < 0 {
		return Placement{}, &UnplaceableError{Request: r.Name, Reason: ReasonInvalid, Detail: "negative amount"}
	}
	mask, ok := s.c.modelMask(r.Models)
	if !ok && r.GPUs > 0 {
		return Placement{}, &UnplaceableError{Request: r.Name, Reason: ReasonNoModel, Detail: "models " + strings.Join(r.Models, "|")}
	}
	s.pick = choice{node: -1}
	s.pick.tb, _ = s.p.(TieBreaker)
	s.unmet = false
	switch {
	case s.byState && (r.Filter != nil || r.constrained()):
		s.placeFiltered(r, mask)
	case s.byState:
		// One node per state, the one with the smallest name (states.go); a GPU
		// request visits only the states where one of its GPUs could fit.
		x := &s.c.states
		if r.GPUs > 0 {
			lo := int32(freeBuckets) // whole GPUs: only the states with a whole free GPU
			if !r.Whole() {
				lo = freeBucket(r.Share)
			}
			for b := lo; b < freeBuckets; b++ {
				for _, g := range x.byFree[b] {
					s.consider(int(x.groups[g].first), r, mask)
				}
			}
			for _, g := range x.whole {
				if x.groups[g].bucket < lo { // not visited above
					s.consider(int(x.groups[g].first), r, mask)
				}
			}
		} else {
			for _, g := range x.live {
				s.consider(int(x.groups[g].first), r, mask)
			}
			for _, g := range x.spent {
				s.consider(int(x.groups[g].first), r, mask)
			}
		}
	default:
		for ni := range s.c.nodes {
			s.consider(ni, r, mask)
		}
	}
	bestNode := s.pick.node
	if bestNode < 0 {
		return Placement{}, s.whyNot(r, mask)
	}
	p := Placement{Node: bestNode, NodeName: s.c.nodes[bestNode].name}
	if len(s.best) > 0 {
		p.GPUs = append([]int(nil), s.best...)
		p.Share = make([]int64, len(p.GPUs))
		for i, g := range p.GPUs {
			p.Share[i] = s.c.take(bestNode, g, r)
		}
	}
	return p, nil
}

// choice is the best node a decision has found so far.
type choice struct {
	node, ties int
	score      float64
	tb         TieBreaker
	grp        int
	tie        float64
	tieOn      bool
}

// consider scores node ni for r and keeps it if it beats the best so far.
func (s *Scheduler) consider(ni int, r *Request, mask uint64) {
	n := &s.c.nodes[ni]
	if !n.fitsCPU(r) {
		return
	}
	s.elig = s.elig[:0]
	if r.GPUs > 0 {
		if len(n.gpuFree) < r.GPUs || (mask != 0 && n.models&mask == 0) {
			return
		}
		for g := range n.gpuFree {
			if s.c.usable(ni, g, r, mask) {
				s.elig = append(s.elig, g)
			}
		}
		if len(s.elig) < r.GPUs || (r.constrained() && !s.constrain(ni, r)) {
			return
		}
	} else if r.Filter != nil && !r.Filter(ni, -1) {
		return
	}
	score, gpus := s.p.Score(s.c, ni, r, s.elig, s.cand[:0])
	s.cand = gpus
	s.scored++
	s.offer(ni, score, gpus)
}

// offer keeps node ni, scored score with GPUs gpus, if it beats the best so far.
func (s *Scheduler) offer(ni int, score float64, gpus []int) {
	b := &s.pick
	grp, tie := 0, 0.0
	if b.tb != nil {
		grp, tie, b.tieOn = b.tb.Tie(ni)
	}
	switch {
	case b.node < 0 || score > b.score:
		b.node, b.score, b.ties = ni, score, 1
		b.grp, b.tie = grp, tie
		s.best = append(s.best[:0], gpus...)
	case score == b.score && b.tieOn && grp == b.grp && tie > b.tie+1e-9:
		b.node, b.tie = ni, tie
		s.best = append(s.best[:0], gpus...)
	case score == b.score && s.random:
		b.ties++
		if s.rng.Intn(b.ties) == 0 {
			b.node = ni
			s.best = append(s.best[:0], gpus...)
		}
	case score == b.score && s.c.states.rank[ni] < s.c.states.rank[b.node]:
		// deterministic ties: the smallest node name, as the FGD
		// artifact's patched kube-scheduler does (nodes of one name: the
		// first)
		b.node, b.grp, b.tie = ni, grp, tie
		s.best = append(s.best[:0], gpus...)
	}
}

// Allocate places r and records the placement in the cluster.
func (s *Scheduler) Allocate(r *Request) (Placement, error) {
	p, err := s.Place(r)
	if err != nil {
		return p, err
	}
	return p, s.c.Assign(p, r)
}

// shapeOf is what whyNot's answer depends on in a request.
type shapeOf struct {
	cpu, mem, share int64
	gpus            int
	mask            uint64
}

// whyNot tells a request that fits nowhere now from one that never could.
func (s *Scheduler) whyNot(r *Request, mask uint64) error {
	if s.unmet {
		return unmetError(r)
	}
	k := shapeOf{cpu: r.CPUMilli, mem: r.MemoryMiB, share: r.Share, gpus: r.GPUs, mask: mask}
	large, ok := s.c.tooLarge[k]
	if !ok {
		large = s.c.tooLargeFor(r, mask)
		if s.c.tooLarge == nil || len(s.c.tooLarge) >= 1<<12 {
			s.c.tooLarge = map[shapeOf]bool{} // bounded: shapes are many in a long-lived allocator
		}
		s.c.tooLarge[k] = large
	}
	if large {
		return &UnplaceableError{Request: r.Name, Reason: ReasonTooLarge}
	}
	return &UnplaceableError{Request: r.Name, Reason: ReasonNoCapacity}
}

// tooLargeFor reports whether no node could hold r even empty.
func (c *Cluster) tooLargeFor(r *Request, mask uint64) bool {
	for ni := range c.nodes {
		n := &c.nodes[ni]
		if n.cpuCap < r.CPUMilli || n.memCap < r.MemoryMiB {
			continue
		}
		k := 0
		for g := range n.gpuCap {
			if mask != 0 && mask&(1<<n.gpuModel[g]) == 0 {
				continue
			}
			if r.Whole() || r.Share <= n.gpuCap[g] {
				k++
			}
		}
		if k >= r.GPUs {
			return false
		}
	}
	return true
}
