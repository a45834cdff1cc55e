package claimqueue

import (
	"slices"
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

func TestClaimQueueOrderAndForget(t *testing.T) {
	q := New()
	t0 := builders.Created.Time
	q.Add("b/x", t0.Add(time.Second), t0)
	q.Add("a/y", t0.Add(2*time.Second), t0)
	q.Add("a/x", t0.Add(2*time.Second), t0)
	q.Add("a/z", t0, t0)
	q.Add("a/z", t0.Add(time.Hour), t0.Add(time.Hour)) // a second Add keeps the first
	if got, want := q.InOrder("a"), []string{"a/z", "a/x", "a/y"}; !slices.Equal(got, want) {
		t.Errorf("InOrder(a) = %v, want %v (oldest first, then by name)", got, want)
	}
	if got, want := q.InOrder(""), []string{"a/z", "b/x", "a/x", "a/y"}; !slices.Equal(got, want) {
		t.Errorf("InOrder() = %v, want %v", got, want)
	}
	if q.Forget("a/z") {
		t.Error("a claim that never waited for quota left the quota queue")
	}
	if q.Len() != 3 {
		t.Errorf("Len = %d after Forget, want 3", q.Len())
	}
}

func TestClaimQueueQuotaFIFO(t *testing.T) {
	q := New()
	t0 := builders.Created.Time
	q.Add("a/old", t0, t0)
	q.Add("a/young", t0.Add(time.Second), t0)
	if _, ok := q.QuotaAhead("a", "a/young", t0.Add(time.Second)); ok {
		t.Fatal("a claim is ahead before any waits for quota")
	}
	q.WaitForQuota("a/old", t0, true)
	if ahead, ok := q.QuotaAhead("a", "a/young", t0.Add(time.Second)); !ok || ahead != "a/old" {
		t.Errorf("QuotaAhead = %q, %v; want a/old ahead of a/young", ahead, ok)
	}
	if _, ok := q.QuotaAhead("a", "a/old", t0); ok {
		t.Error("the head of the queue waits behind itself")
	}
	q.WaitForQuota("a/young", t0.Add(time.Second), true) // queued behind the head
	if ahead, ok := q.QuotaAhead("a", "a/youngest", t0.Add(2*time.Second)); !ok || ahead != "a/old" {
		t.Errorf("QuotaAhead = %q, %v; want the head a/old, the claim that waits for quota", ahead, ok)
	}
	if ahead, ok := q.QuotaAhead("a", "a/young", t0.Add(time.Second)); !ok || ahead != "a/old" {
		t.Errorf("QuotaAhead for a queued claim = %q, %v; want a/old", ahead, ok)
	}
	q.WaitForQuota("a/young", t0.Add(time.Second), false)
	if _, ok := q.QuotaAhead("b", "b/c", t0.Add(time.Hour)); ok {
		t.Error("another namespace's quota queue held a claim")
	}
	if !q.WaitForQuota("a/old", t0, false) {
		t.Error("placing the head did not report that it left the quota queue")
	}
	q.WaitForQuota("a/old", t0, true)
	if !q.Forget("a/old") {
		t.Error("forgetting a claim that waits for quota did not report that it left the queue")
	}
	if _, ok := q.QuotaAhead("a", "a/young", t0.Add(time.Second)); ok {
		t.Error("a forgotten claim still holds the quota queue")
	}
}

func TestClaimQueueAnyUndecided(t *testing.T) {
	q := New()
	t0 := builders.Created.Time
	if !q.AnyUndecided([]string{"a/unseen"}, t0) {
		t.Error("a claim never looked at counts as decided")
	}
	q.Add("a/c", t0, t0)
	if !q.AnyUndecided([]string{"a/c"}, t0.Add(firstLookGrace/2)) {
		t.Error("a claim looked at a moment ago without a decision does not hold its namespace")
	}
	if q.AnyUndecided([]string{"a/c"}, t0.Add(firstLookGrace)) {
		t.Error("an undecided claim holds its namespace past the grace")
	}
	q.Decided("a/c")
	if q.AnyUndecided([]string{"a/c"}, t0) {
		t.Error("a decided claim holds its namespace")
	}
}

// A claim left for later for its namespace's share holds no less critical claim of another
// namespace back in the pass, but, never decided, still goes before its namespace's younger
// claims.
func TestClaimQueueDeferred(t *testing.T) {
	q := New()
	t0 := builders.Created.Time
	q.NewPass(t0)
	q.Add("greedy/c", t0, t0)
	q.SetClass("greedy/c", api.LatencyStandard)
	q.Add("other/c", t0, t0)
	q.SetClass("other/c", api.LatencyBestEffort)
	if _, held := q.MoreCriticalFirst("other/c", false, t0); !held {
		t.Fatal("the test needs the standard claim to go first while undecided")
	}
	q.Deferred("greedy/c")
	if first, held := q.MoreCriticalFirst("other/c", false, t0); held {
		t.Errorf("a deferred claim (%s) holds a less critical one back", first)
	}
	if !q.AnyUndecided([]string{"greedy/c"}, t0) {
		t.Error("a deferred claim never decided on lets its namespace's younger claims go first")
	}
}

func TestClaimQueueCriticalFirst(t *testing.T) {
	q := New()
	t0 := builders.Created.Time
	q.Add("a/be", t0, t0)
	q.Add("b/std", t0.Add(time.Second), t0)
	q.Add("c/crit", t0.Add(2*time.Second), t0)
	q.Add("d/unknown", t0.Add(3*time.Second), t0)
	q.SetClass("a/be", api.LatencyBestEffort)
	q.SetClass("b/std", api.LatencyStandard)
	q.SetClass("c/crit", api.LatencyCritical)
	if got, want := q.InOrder(""), []string{"c/crit", "b/std", "d/unknown", "a/be"}; !slices.Equal(got, want) {
		t.Errorf("InOrder() = %v, want %v (critical first, then by age within a class)", got, want)
	}
	for _, k := range []string{"a/be", "b/std", "c/crit"} {
		q.Decided(k)
	}
	if first, ok := q.MoreCriticalFirst("a/be", false, t0); ok {
		t.Errorf("a best-effort claim waits for %s, which was decided on since the last capacity change", first)
	}
	q.NewPass(t0.Add(time.Minute))
	now := t0.Add(time.Minute + time.Second)
	if first, ok := q.MoreCriticalFirst("a/be", false, now); !ok || first != "b/std" {
		t.Errorf("after a capacity change a best-effort claim goes before the others: first %q, %v", first, ok)
	}
	if _, ok := q.MoreCriticalFirst("c/crit", false, now); ok {
		t.Error("a critical claim waits")
	}
	if _, ok := q.MoreCriticalFirst("d/unknown", false, now); ok {
		t.Error("a claim whose class is not known yet waits")
	}
	q.Decided("b/std")
	if first, ok := q.MoreCriticalFirst("a/be", false, now); !ok || first != "c/crit" {
		t.Errorf("first %q, %v; want c/crit, not decided on in this pass", first, ok)
	}
	q.Decided("c/crit")
	if first, ok := q.MoreCriticalFirst("a/be", false, now); ok {
		t.Errorf("a best-effort claim waits for %s, decided on in this pass", first)
	}
	// The hold is bounded: a critical claim that cannot be decided on (its namespace's quota
	// queue holds it) does not stop the others for long.
	q.NewPass(now)
	if _, ok := q.MoreCriticalFirst("b/std", false, now.Add(firstLookGrace)); ok {
		t.Error("a standard claim waits past the grace")
	}
	// Within a namespace under quota, a younger critical claim waits for the older ones.
	q.Add("b/crit", t0.Add(5*time.Second), now)
	q.SetClass("b/crit", api.LatencyCritical)
	q.Decided("c/crit")
	if first, ok := q.MoreCriticalFirst("b/std", true, now); ok {
		t.Errorf("b/std waits for %s, which waits behind it in the quota queue", first)
	}
	if first, ok := q.MoreCriticalFirst("b/std", false, now); !ok || first != "b/crit" {
		t.Errorf("without a quota b/std lets %q, %v go first; want b/crit", first, ok)
	}
}
