// Package claimqueue is the allocator's queue of the claims it has yet to place.
package claimqueue

import (
	"sort"
	"strings"
	"sync"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Queue is the allocator's queue of claims it has yet to place: when each was created,
// when the allocator first looked at it and whether it has decided on it since, and each
// namespace's quota queue, a strict FIFO by creation (as Kueue's StrictFIFO): a claim that
// waits for quota holds the claims of its namespace created after it, and they wait in the
// queue behind it, so that when it goes the next in line is still ahead of the younger ones.
// Across namespaces claims go by latency class, critical first: each capacity change starts
// a pass, and a claim waits until the more critical claims have been decided on in it (the
// pods a fault displaced come back together; the critical ones must get the room first).
type Queue struct {
	mu      sync.Mutex
	pending map[string]*pendingClaim // claim key → its place in the queue
	// quota holds, per namespace, the claims that wait for quota, by creation time.
	quota map[string]map[string]time.Time
	// pass counts capacity changes; passStart is when the last one came.
	pass      uint64
	passStart time.Time
}

type pendingClaim struct {
	created   time.Time
	firstLook time.Time
	decided   bool
	// rank is the claim's latency class's place (classRank); ranked once its policy is known.
	rank   int
	ranked bool
	// triedIn is the pass in which the allocator last decided on the claim, or deferred it
	// (deferred: it left it for later, for its namespace's share).
	triedIn  uint64
	deferred bool
	// podless: no pod may use the claim yet (none, or all scheduling-gated): it waits for a
	// pod, not for a GPU, and is not counted as waiting for one.
	podless bool
}

// classRank orders latency classes: critical claims are placed first, best-effort last.
func classRank(c api.LatencyClass) int {
	switch c {
	case api.LatencyCritical:
		return 0
	case api.LatencyBestEffort:
		return 2
	}
	return 1
}

// New is an empty queue.
func New() *Queue {
	return &Queue{pending: map[string]*pendingClaim{}, quota: map[string]map[string]time.Time{}}
}

// Add records a claim the allocator is looking at, once: later calls keep the first look.
func (q *Queue) Add(key string, created, now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if _, ok := q.pending[key]; !ok {
		q.pending[key] = &pendingClaim{created: created, firstLook: now}
	}
}

// Decided records that the allocator decided on a claim: placed it, or made it wait.
func (q *Queue) Decided(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.pending[key]; p != nil {
		p.decided, p.deferred = true, false
		p.triedIn = q.pass
	}
}

// Deferred records that the allocator looked at a claim in this pass and left it for later:
// its namespace's evaluations or decisions took their share. It then holds back no less
// critical claim of the pass, as one decided on would not; but a claim never decided on still
// goes before the younger claims of its namespace (AnyUndecided), which their shared share
// defers as well.
func (q *Queue) Deferred(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.pending[key]; p != nil {
		p.deferred = true
		p.triedIn = q.pass
	}
}

// SetClass records a pending claim's latency class (its policy's).
func (q *Queue) SetClass(key string, c api.LatencyClass) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.pending[key]; p != nil {
		p.rank, p.ranked = classRank(c), true
	}
}

// NewPass records a capacity change: every pending claim is to be decided on again, the more
// critical ones first.
func (q *Queue) NewPass(now time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.pass++
	q.passStart = now
}

// MoreCriticalFirst returns a pending claim of a more critical latency class than key's that
// has not been decided on since the last capacity change (key must let it go first), for at
// most firstLookGrace after that change or after the other claim was first looked at. With
// quotaBinds, claims of key's namespace created after it are passed over: they wait for key
// in the quota queue.
func (q *Queue) MoreCriticalFirst(key string, quotaBinds bool, now time.Time) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	me := q.pending[key]
	if me == nil || !me.ranked {
		return "", false
	}
	ns, _, _ := strings.Cut(key, "/")
	first, found := "", false
	for k, p := range q.pending {
		if !p.ranked || p.rank >= me.rank || p.triedIn >= q.pass && (p.decided || p.deferred) {
			continue
		}
		start := p.firstLook
		if q.passStart.After(start) {
			start = q.passStart
		}
		if now.Sub(start) >= firstLookGrace {
			continue
		}
		if quotaBinds && strings.HasPrefix(k, ns+"/") && !p.created.Before(me.created) {
			continue
		}
		if !found || k < first {
			first, found = k, true
		}
	}
	return first, found
}

// Forget drops a claim that is placed, allocated by someone else, or gone. It reports
// whether the claim left its namespace's quota queue: the claims behind it may go on.
func (q *Queue) Forget(key string) (leftQuotaQueue bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.pending, key)
	return q.leaveQuota(key)
}

func (q *Queue) leaveQuota(key string) bool {
	ns, _, _ := strings.Cut(key, "/")
	w := q.quota[ns]
	if _, ok := w[key]; !ok {
		return false
	}
	delete(w, key)
	if len(w) == 0 {
		delete(q.quota, ns)
	}
	return true
}

// InOrder lists the pending claims of one namespace ("": all), the most critical latency
// class first (a claim whose class is not known yet counts as standard), oldest first
// within a class.
func (q *Queue) InOrder(ns string) []string {
	type entry struct {
		key     string
		rank    int
		created time.Time
	}
	q.mu.Lock()
	list := make([]entry, 0, len(q.pending))
	for k, p := range q.pending {
		if ns == "" || strings.HasPrefix(k, ns+"/") {
			rank := classRank(api.LatencyStandard)
			if p.ranked {
				rank = p.rank
			}
			list = append(list, entry{k, rank, p.created})
		}
	}
	q.mu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		if list[i].rank != list[j].rank {
			return list[i].rank < list[j].rank
		}
		return list[i].created.Before(list[j].created) || (list[i].created.Equal(list[j].created) && list[i].key < list[j].key)
	})
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.key
	}
	return out
}

// SetPodless records whether the claim waits for a pod rather than for a GPU.
func (q *Queue) SetPodless(key string, podless bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if p := q.pending[key]; p != nil {
		p.podless = podless
	}
}

// Len is the number of pending claims that wait for a GPU (not for a pod).
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, p := range q.pending {
		if !p.podless {
			n++
		}
	}
	return n
}

// firstLookGrace is how long a claim that the allocator looked at but could not decide on
// (its pod did not exist yet) holds the claims of its namespace created after it.
const firstLookGrace = 5 * time.Second

// AnyUndecided reports whether one of the claims is still to be decided on: never looked at,
// or looked at less than firstLookGrace ago without a decision (a template's claim precedes
// its pod by a moment). An unused standalone claim so holds its namespace for seconds only.
func (q *Queue) AnyUndecided(keys []string, now time.Time) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		p, seen := q.pending[k]
		if !seen || (!p.decided && now.Sub(p.firstLook) < firstLookGrace) {
			return true
		}
	}
	return false
}

// QuotaAhead returns the oldest claim of the namespace's quota queue if it was created
// before key: the claim at the head, which waits for quota.
func (q *Queue) QuotaAhead(ns, key string, created time.Time) (string, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	head, headCreated := "", time.Time{}
	for other, c := range q.quota[ns] {
		if head == "" || c.Before(headCreated) || (c.Equal(headCreated) && other < head) {
			head, headCreated = other, c
		}
	}
	if head == "" || head == key || created.Before(headCreated) || (created.Equal(headCreated) && key < head) {
		return "", false
	}
	return head, true
}

// WaitForQuota puts a claim in its namespace's quota queue (waiting) or takes it out. It
// reports whether the claim left the queue.
func (q *Queue) WaitForQuota(key string, created time.Time, waiting bool) (leftQuotaQueue bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !waiting {
		return q.leaveQuota(key)
	}
	ns, _, _ := strings.Cut(key, "/")
	if q.quota[ns] == nil {
		q.quota[ns] = map[string]time.Time{}
	}
	q.quota[ns][key] = created
	return false
}

// NamespacePending is one namespace's pending claims: how many, and when the oldest was created.
type NamespacePending struct {
	Claims int
	Oldest time.Time
}

// ByNamespace counts the claims waiting for a GPU per namespace, with the oldest's creation
// time.
func (q *Queue) ByNamespace() map[string]NamespacePending {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := map[string]NamespacePending{}
	for k, p := range q.pending {
		if p.podless {
			continue
		}
		ns, _, _ := strings.Cut(k, "/")
		e := out[ns]
		if e.Claims == 0 || p.created.Before(e.Oldest) {
			e.Oldest = p.created
		}
		e.Claims++
		out[ns] = e
	}
	return out
}
