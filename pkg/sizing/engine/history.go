package engine

import (
	"sync"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// History keeps, per share and per workload under sizing Auto, the peak of each report
// interval: what burst admission sums in time. It also holds consolidation's state: the GPU
// being emptied (G names a GPU) and those left alone after a drain gave up. Its lock is a
// leaf: nothing else is locked while it is held, so a placement path may ask it under its
// own locks.
type History[G comparable] struct {
	mu        sync.Mutex
	clock     sizing.Clock
	shares    map[string]*sizing.Maxima
	workloads map[api.SizingWorkload]*sizing.Maxima
	// since is when each workload first had MinIntervals recorded.
	since map[api.SizingWorkload]time.Time
	// drain is the GPU consolidation empties, since drainSince: no bursting share is placed
	// there.
	drain      G
	draining   bool
	drainSince time.Time
	// rest: GPUs whose drain gave up or was refused, and until when they are left alone.
	rest map[G]time.Time
}

// NewHistory keeps maxima on clock's report intervals, for its window.
func NewHistory[G comparable](clock sizing.Clock) *History[G] {
	return &History[G]{clock: clock, shares: map[string]*sizing.Maxima{}, workloads: map[api.SizingWorkload]*sizing.Maxima{}, since: map[api.SizingWorkload]time.Time{}}
}

// Draining is the GPU consolidation empties and since when; ok is false when none is.
func (h *History[G]) Draining() (g G, since time.Time, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.drain, h.drainSince, h.draining
}

// IsDraining says whether consolidation empties g.
func (h *History[G]) IsDraining(g G) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.draining && h.drain == g
}

// SetDraining starts emptying g at now.
func (h *History[G]) SetDraining(g G, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drain, h.draining, h.drainSince = g, true, now
}

// ClearDraining ends the drain of g (if it is the one) and leaves g alone until restUntil
// (zero: not); rests over by now are forgotten, so a GPU gone since is not kept.
func (h *History[G]) ClearDraining(g G, now, restUntil time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.draining && h.drain == g {
		var none G
		h.drain, h.draining, h.drainSince = none, false, time.Time{}
	}
	for r, until := range h.rest {
		if !now.Before(until) {
			delete(h.rest, r)
		}
	}
	if !restUntil.IsZero() {
		if h.rest == nil {
			h.rest = map[G]time.Time{}
		}
		h.rest[g] = restUntil
	}
}

// Resting says whether g is left alone after a drain gave up, at now.
func (h *History[G]) Resting(g G, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.rest[g]
	if ok && !now.Before(until) {
		delete(h.rest, g)
		return false
	}
	return ok
}

// Record takes a share's usage summary for it and for its workload, at now.
func (h *History[G]) Record(w api.SizingWorkload, share string, u api.ShareUsage, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if newest, _, ok := h.workloads[w].Newest(); ok && h.clock.Interval(u.From)-newest > int64(h.clock.Window) {
		delete(h.since, w) // back after a pause longer than the window: measured anew
	}
	for _, m := range []*sizing.Maxima{h.shareMaxima(share), h.workloadMaxima(w)} {
		m.Record(h.clock, u.From, u.To, u.MemoryMaxBytes)
	}
	if _, ok := h.since[w]; !ok && h.workloads[w].Known() >= MinIntervals {
		h.since[w] = now
	}
}

// MeasuredSince is when w first had MinIntervals recorded (zero: not yet).
func (h *History[G]) MeasuredSince(w api.SizingWorkload) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since[w]
}

func (h *History[G]) shareMaxima(share string) *sizing.Maxima {
	m := h.shares[share]
	if m == nil {
		m = &sizing.Maxima{}
		h.shares[share] = m
	}
	return m
}

func (h *History[G]) workloadMaxima(w api.SizingWorkload) *sizing.Maxima {
	m := h.workloads[w]
	if m == nil {
		m = &sizing.Maxima{}
		h.workloads[w] = m
	}
	return m
}

// ForgetShare drops a share that is gone; its workload's maxima stay.
func (h *History[G]) ForgetShare(share string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.shares, share)
}

// KeepWorkloads forgets the workloads keep says no.
func (h *History[G]) KeepWorkloads(keep func(api.SizingWorkload) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.workloads {
		if !keep(w) {
			delete(h.workloads, w)
			delete(h.since, w)
		}
	}
}

// Measured says whether w's use is recorded for MinIntervals, the newest within the window
// before now: a workload back after a longer pause, or switched to Auto, is placed per claim
// until it has reported again.
func (h *History[G]) Measured(w api.SizingWorkload, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.workloads[w]
	newest, _, ok := m.Newest()
	return ok && newest > h.clock.Interval(now)-int64(h.clock.Window) && m.Known() >= MinIntervals
}

// Tenant is a share on a GPU as admission counts it: Limit is all it may use (its burst cap,
// or what it holds), counted where nothing of it is known.
type Tenant struct {
	Share    string
	Workload api.SizingWorkload
	Limit    int64
}

// Refusal says why a GPU does not admit a bursting share: at the interval starting At, the
// tenants and the newcomer together would use Need, more than Limit.
type Refusal struct {
	At          time.Time
	Need, Limit int64
}

// Admits says whether a GPU of memCap bytes, holding tenants, takes a bursting share of
// workload w at now (nil) or why not: at every interval of the window where w's use is known
// (sizing.Expected), it plus each tenant's (sizing.Counted) must fit the GPU less headroom.
func (h *History[G]) Admits(memCap int64, tenants []Tenant, w api.SizingWorkload, headroom float64, now time.Time) *Refusal {
	h.mu.Lock()
	defer h.mu.Unlock()
	to := h.clock.Interval(now)
	from := to - int64(h.clock.Window) + 1
	counted := make([]func(int64) int64, 0, len(tenants))
	for _, t := range tenants {
		counted = append(counted, sizing.Counted(h.shares[t.Share], h.workloads[t.Workload], t.Limit))
	}
	limit := int64(float64(memCap) / (1 + headroom))
	ok, over, need := sizing.Admit(limit, from, to, sizing.Expected(h.workloads[w]), counted)
	if ok {
		return nil
	}
	return &Refusal{At: time.Unix(0, over*int64(h.clock.Width)).UTC(), Need: need, Limit: limit}
}

// Load is the largest use of tenants together (sizing.Counted) over the window up to now.
func (h *History[G]) Load(tenants []Tenant, now time.Time) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	counted := make([]func(int64) int64, 0, len(tenants))
	for _, t := range tenants {
		counted = append(counted, sizing.Counted(h.shares[t.Share], h.workloads[t.Workload], t.Limit))
	}
	to := h.clock.Interval(now)
	var most int64
	for k := to - int64(h.clock.Window) + 1; k <= to; k++ {
		var sum int64
		for _, c := range counted {
			sum += c(k)
		}
		most = max(most, sum)
	}
	return most
}

// Uses is each share's use at the newest interval any of them recorded, and in the one
// before, as admission counts a share on its own (0 where nothing is known); ok is false
// where none recorded anything.
func (h *History[G]) Uses(shares []string) (uses []Use, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var k int64
	for _, s := range shares {
		if n, _, has := h.shares[s].Newest(); has && (!ok || n > k) {
			k, ok = n, true
		}
	}
	if !ok {
		return nil, false
	}
	uses = make([]Use, len(shares))
	for i, s := range shares {
		counted := sizing.Counted(h.shares[s], nil, 0)
		uses[i] = Use{Cur: counted(k), Prev: counted(k - 1)}
	}
	return uses, true
}
