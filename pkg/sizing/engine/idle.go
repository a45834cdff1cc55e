package engine

import (
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// IdleGap is the most time between two idle reports of a share that still counts as
// unbroken: the plugin starts a new window one poll after publishing (10s by default); a
// longer gap (a plugin restart) was not measured, so idleness starts again.
const IdleGap = time.Minute

// Idle keeps, per share, since when all its usage reports were idle, for the workload (W
// names one) its pods belong to. A workload is scaled to zero once every share of it was
// idle for its policy's bound. It is not safe for concurrent use.
type Idle[W comparable] struct {
	spans map[string]idleSpan[W]
}

type idleSpan[W comparable] struct {
	w         W
	since, to time.Time
}

// NewIdle keeps no spans yet.
func NewIdle[W comparable]() *Idle[W] { return &Idle[W]{spans: map[string]idleSpan[W]{}} }

// Observe takes a share's usage report, of workload w, under a bound of SM activity
// (smBelow): a report is idle when it has SM samples and its highest SM activity is below
// the bound; a busy one ends the span.
func (s *Idle[W]) Observe(share string, w W, u api.ShareUsage, smBelow int) {
	if u.SMSamples == 0 || u.SMMaxPercent >= smBelow {
		delete(s.spans, share)
		return
	}
	span, ok := s.spans[share]
	switch {
	case ok && span.w == w && !u.To.After(span.to):
		return // a report already counted
	case ok && span.w == w && u.From.Sub(span.to) <= IdleGap:
		span.to = u.To
	default:
		span = idleSpan[W]{w: w, since: u.From, to: u.To}
	}
	s.spans[share] = span
}

// Forget drops a share: gone, scaled down, or no longer under a policy that scales it.
func (s *Idle[W]) Forget(share string) { delete(s.spans, share) }

// Workloads are those with a share idle now: the candidates to scale to zero.
func (s *Idle[W]) Workloads() map[W]bool {
	out := map[W]bool{}
	for _, span := range s.spans {
		out[span.w] = true
	}
	return out
}

// IdleFor says whether share, of workload w, has been idle for after without a break.
func (s *Idle[W]) IdleFor(share string, w W, after time.Duration) bool {
	span, ok := s.spans[share]
	return ok && span.w == w && span.to.Sub(span.since) >= after
}
