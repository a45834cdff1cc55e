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
	s.c.attaching = s
	p.Attach(s.c)
	s.c.attaching = nil
	s.p = p
	s.random = false
	if rt, ok := p.(RandomTies); ok {
		s.random = rt.RandomTies()
	}
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
	bestNode, bestScore, ties := -1, 0.0, 0
	tb, _ := s.p.(TieBreaker)
	bestGrp, bestTie, tieOn := 0, 0.0, false
	for ni := range s.c.nodes {
		n := &s.c.nodes[ni]
		if !n.fitsCPU(r) {
			continue
		}
		s.elig = s.elig[:0]
		if r.GPUs > 0 {
			if len(n.gpuFree) < r.GPUs || (mask != 0 && n.models&mask == 0) {
				continue
			}
			for g := range n.gpuFree {
				if s.c.usable(ni, g, r, mask) {
					s.elig = append(s.elig, g)
				}
			}
			if len(s.elig) < r.GPUs {
				continue
			}
		} else if r.Filter != nil && !r.Filter(ni, -1) {
			continue
		}
		score, gpus := s.p.Score(s.c, ni, r, s.elig, s.cand[:0])
		s.cand = gpus
		s.scored++
		grp, tie := 0, 0.0
		if tb != nil {
			grp, tie, tieOn = tb.Tie(ni)
		}
		switch {
		case bestNode < 0 || score > bestScore:
			bestNode, bestScore, ties = ni, score, 1
			bestGrp, bestTie = grp, tie
			s.best = append(s.best[:0], gpus...)
		case score == bestScore && tieOn && grp == bestGrp && tie > bestTie+1e-9:
			bestNode, bestTie = ni, tie
			s.best = append(s.best[:0], gpus...)
		case score == bestScore && s.random:
			ties++
			if s.rng.Intn(ties) == 0 {
				bestNode = ni
				s.best = append(s.best[:0], gpus...)
			}
		case score == bestScore && n.name < s.c.nodes[bestNode].name:
			// deterministic ties: the smallest node name, as the FGD
			// artifact's patched kube-scheduler does
			bestNode, bestGrp, bestTie = ni, grp, tie
			s.best = append(s.best[:0], gpus...)
		}
	}
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

// Allocate places r and records the placement in the cluster.
func (s *Scheduler) Allocate(r *Request) (Placement, error) {
	p, err := s.Place(r)
	if err != nil {
		return p, err
	}
	return p, s.c.Assign(p, r)
}

// whyNot tells a request that fits nowhere now from one that never could.
func (s *Scheduler) whyNot(r *Request, mask uint64) error {
	for ni := range s.c.nodes {
		n := &s.c.nodes[ni]
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
			return &UnplaceableError{Request: r.Name, Reason: ReasonNoCapacity}
		}
	}
	return &UnplaceableError{Request: r.Name, Reason: ReasonTooLarge}
}
