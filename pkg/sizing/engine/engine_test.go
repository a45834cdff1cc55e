package engine

import (
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

const gib = int64(1) << 30

// A bursting share is guaranteed its typical peak and capped at twice its peak, both within
// what it asks; one with nothing to burst to does not burst.
func TestBurstSize(t *testing.T) {
	rec := api.SizingRecommendation{TypicalBytes: 10 * gib, PeakBytes: 30 * gib}
	if g, c, ok := BurstSize(rec, 0); !ok || g != 10*gib || c != 60*gib {
		t.Errorf("got %d, %d, %v", g, c, ok)
	}
	if g, c, ok := BurstSize(rec, 40*gib); !ok || g != 10*gib || c != 40*gib {
		t.Errorf("asked 40Gi: got %d, %d, %v", g, c, ok)
	}
	if _, _, ok := BurstSize(rec, 8*gib); ok {
		t.Error("a claim asking less than its guarantee bursts")
	}
}

// Busy and mostly idle workloads never burst; a whole GPU the recommendation fills stays.
func TestRebursts(t *testing.T) {
	rec := api.SizingRecommendation{MemoryBytes: 20 * gib, TypicalBytes: 10 * gib, PeakBytes: 15 * gib, ComputePercent: 50}
	if !Rebursts(rec, 80*gib, 80*gib, 0) {
		t.Error("a half-busy workload on a whole GPU does not burst")
	}
	for _, compute := range []int{BusyComputePercent, IdleComputePercent} {
		r := rec
		r.ComputePercent = compute
		if Rebursts(r, 80*gib, 80*gib, 0) {
			t.Errorf("compute %d%% bursts", compute)
		}
	}
	r := rec
	r.MemoryBytes = 80 * gib
	if Rebursts(r, 80*gib, 80*gib, 0) {
		t.Error("a whole GPU its recommendation fills bursts")
	}
}

// The tenant that grew most moves, once the tenants near the GPU's memory.
func TestOverfull(t *testing.T) {
	uses := []Use{{Cur: 40 * gib, Prev: 35 * gib}, {Cur: 38 * gib, Prev: 20 * gib}}
	if move, sum, ok := Overfull(uses, 80*gib); !ok || move != 1 || sum != 78*gib {
		t.Errorf("got %d, %d, %v", move, sum, ok)
	}
	if _, _, ok := Overfull(uses, 100*gib); ok {
		t.Error("moved with room left")
	}
	if _, _, ok := Overfull(uses[:1], 10*gib); ok {
		t.Error("moved a tenant alone on its GPU")
	}
}

// Candidates come least guaranteed first, ties in the order given, at most
// ConsolidateCandidates; Assign takes one GPU per tenant.
func TestConsolidation(t *testing.T) {
	var all []Candidate[int]
	for g := range ConsolidateCandidates + 2 {
		all = append(all, Candidate[int]{GPU: g, Guaranteed: int64(10 - g/2)})
	}
	got := Candidates(all)
	if len(got) != ConsolidateCandidates || got[0] != 8 || got[1] != 9 || got[2] != 6 {
		t.Errorf("candidates %v", got)
	}
	to, ok := Assign(2, []int{5, 6, 7}, func(i, g int) bool { return g != 5 || i == 0 })
	if !ok || to[0] != 5 || to[1] != 6 {
		t.Errorf("assigned %v, %v", to, ok)
	}
	if _, ok := Assign(2, []int{5}, func(int, int) bool { return true }); ok {
		t.Error("two tenants assigned one GPU")
	}
}

// Near its cap a share grows and raises its workload's floor; at what its claim asks it is
// told; far below its cap for the shrink window it shrinks; a bursting share never shrinks.
func TestResizer(t *testing.T) {
	w := api.SizingWorkload{Name: "web", Request: "gpu"}
	t0 := time.Unix(0, 0)
	r := NewResizer(0.15, time.Hour)
	rec := api.SizingRecommendation{MemoryBytes: 4 * gib}
	near := Report{Workload: w, Share: "s", Usage: api.ShareUsage{From: t0, To: t0.Add(5 * time.Minute), MemoryMaxBytes: 10 * gib}, Cap: 10 * gib, GPUMemory: 80 * gib}
	if d := r.Decide(near, rec, true); d.Resize != Grow || d.Want != 11776<<20 || r.Floor(w) != d.Want {
		t.Errorf("near cap: %+v, floor %d", d, r.Floor(w))
	}
	near.Asked = 10 * gib
	if d := r.Decide(near, rec, true); d.Resize != AtRequest {
		t.Errorf("at request: %+v", d)
	}
	r = NewResizer(0.15, time.Hour)
	low := Report{Workload: w, Share: "s", Cap: 40 * gib, GPUMemory: 80 * gib}
	for i := range 13 {
		low.Usage = api.ShareUsage{From: t0.Add(time.Duration(i) * 5 * time.Minute), To: t0.Add(time.Duration(i+1) * 5 * time.Minute), MemoryMaxBytes: 2 * gib}
		d := r.Decide(low, rec, true)
		if want := map[bool]Resize{true: Shrink, false: Keep}[i >= 11]; d.Resize != want {
			t.Errorf("report %d: %+v, want %v", i, d, want)
		}
	}
	low.Bursting = true
	if d := r.Decide(low, rec, true); d.Resize != Keep {
		t.Errorf("a bursting share: %+v", d)
	}
	low.Bursting = false
	low.ComesBackWhole = func(api.SizingRecommendation) bool { return true }
	if d := r.Decide(low, rec, true); d.Resize != Keep {
		t.Errorf("a share that would come back whole: %+v", d)
	}
}

// Admission sums the tenants' and the newcomer's use interval by interval.
func TestHistoryAdmits(t *testing.T) {
	h := NewHistory[string](sizing.Clock{Width: 5 * time.Minute, Window: 12})
	t0 := time.Unix(0, 0)
	a, b := api.SizingWorkload{Name: "a"}, api.SizingWorkload{Name: "b"}
	for i := range 6 {
		from := t0.Add(time.Duration(i) * 5 * time.Minute)
		use := func(high bool) int64 {
			if high {
				return 40 * gib
			}
			return 5 * gib
		}
		h.Record(a, "sa", api.ShareUsage{From: from, To: from.Add(time.Minute), MemoryMaxBytes: use(i%2 == 0)}, from)
		h.Record(b, "sb", api.ShareUsage{From: from, To: from.Add(time.Minute), MemoryMaxBytes: use(i%2 == 1)}, from)
	}
	now := t0.Add(29 * time.Minute)
	if !h.Measured(a, now) {
		t.Error("a not measured after 6 intervals")
	}
	tenants := []Tenant{{Share: "sa", Workload: a, Limit: 80 * gib}}
	if r := h.Admits(80*gib, tenants, b, 0.15, now); r != nil {
		t.Errorf("alternating peaks refused: %+v", r)
	}
	if r := h.Admits(80*gib, tenants, a, 0.15, now); r == nil || r.Need != 80*gib {
		t.Errorf("coinciding peaks admitted: %+v", r)
	}
}

// An idle span needs SM samples under the bound, without a break longer than IdleGap.
func TestIdle(t *testing.T) {
	s := NewIdle[string]()
	t0 := time.Unix(0, 0)
	report := func(from, to time.Duration, sm int) api.ShareUsage {
		return api.ShareUsage{From: t0.Add(from), To: t0.Add(to), SMSamples: 30, SMMaxPercent: sm}
	}
	s.Observe("s", "web", report(0, 5*time.Minute, 0), 1)
	s.Observe("s", "web", report(5*time.Minute+10*time.Second, 10*time.Minute, 0), 1)
	if !s.IdleFor("s", "web", 10*time.Minute) || s.IdleFor("s", "other", time.Minute) {
		t.Error("an unbroken idle span not seen for its workload")
	}
	s.Observe("s", "web", report(12*time.Minute, 15*time.Minute, 0), 1)
	if s.IdleFor("s", "web", 5*time.Minute) {
		t.Error("a span broken by a gap over IdleGap counted whole")
	}
	s.Observe("s", "web", report(15*time.Minute, 20*time.Minute, 5), 1)
	if len(s.Workloads()) != 0 {
		t.Error("a busy report did not end the span")
	}
}
