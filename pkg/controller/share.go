package controller

import (
	"math"
	"sync"
	"time"
)

// decisionShare is each namespace's share of the allocator's decisions. Decisions are
// serialised under the model's lock, and every capacity change looks at every pending claim
// again: a namespace with hundreds of claims that fit nowhere would make everyone else's
// decisions wait behind its own at every pass. So a namespace's decisions are counted in
// GPUs checked (each is a look at one GPU under the lock), and a namespace that checked more
// than its share waits, and takes no worker's time meanwhile, while others go on.
type decisionShare struct {
	mu     sync.Mutex
	rate   float64 // GPU checks a namespace may make per second, on average
	burst  float64 // and at once
	spaces map[string]*shareBucket
}

type shareBucket struct {
	tokens float64
	at     time.Time
}

// decisionFloor is what any decision costs, in GPU checks, however early it ends: the
// queue's checks under the model's lock are work too, and a claim that never reaches a GPU
// (constraints, a missing class, its quota) must not be free to decide at every pass.
const decisionFloor = 100

// Decision shares: about 200,000 GPU checks a second per namespace (a tenth of the lock's
// time on the machines the benchmarks ran on: BenchmarkDecide), and a million at once, which
// is 250 claims' decisions on 4,000 GPUs.
const (
	decisionRate  = 200_000
	decisionBurst = 1_000_000
)

func newDecisionShare() *decisionShare {
	return &decisionShare{rate: decisionRate, burst: decisionBurst, spaces: map[string]*shareBucket{}}
}

// Wait says how long namespace ns must wait before its next decision (0: none): until its
// share is back, which writes nothing.
func (s *decisionShare) Wait(ns string, now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.refill(ns, now)
	if b.tokens > 0 {
		return 0
	}
	return max(20*time.Millisecond, time.Duration(-b.tokens/s.rate*float64(time.Second)))
}

// Charge counts checks GPU checks against namespace ns.
func (s *decisionShare) Charge(ns string, checks int, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refill(ns, now).tokens -= float64(checks)
}

func (s *decisionShare) refill(ns string, now time.Time) *shareBucket {
	b := s.spaces[ns]
	if b == nil {
		b = &shareBucket{tokens: s.burst, at: now}
		s.spaces[ns] = b
	}
	b.tokens = math.Min(s.burst, b.tokens+now.Sub(b.at).Seconds()*s.rate)
	b.at = now
	return b
}
