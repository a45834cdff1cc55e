// Package selectors evaluates the CEL device selectors of ResourceClaims for the allocator.
//
// A tenant writes the selectors, and the API server accepts up to 8 subrequests of 32
// selectors, each costing up to about 0.1 s per device. So the evaluation is kept away from
// everything that protects other tenants: it runs outside the allocator's model lock, on a
// snapshot of the devices; its verdicts are memoised by expression and device version (no
// interned ids that another claim's expression could inherit); and what it costs is bounded
// per claim (a claim whose selectors cost more than Options.ClaimBudget over the cluster's
// devices is refused for good) and per namespace (a namespace whose new evaluations took
// more than its share waits; other namespaces do not).
package selectors

import (
	"container/list"
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
)

// Device is what a selector sees of one device. Version changes whenever its attributes or
// capacity do, so that a verdict is never read for attributes it was not evaluated on.
type Device struct {
	Key        string
	Version    uint64
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	Capacity   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

// Options bound what evaluations may cost.
type Options struct {
	// Driver is the domain of attributes named without one.
	Driver string
	// ClaimBudget is the CEL cost (in CEL's cost units, as the API server's per-expression
	// limit counts them) that one claim's selectors may take over all devices, memoised or
	// not. Past it the claim is refused until it is deleted.
	ClaimBudget uint64
	// NamespaceRate is the CEL cost per second that a namespace's new evaluations (not
	// memoised) may take on average; NamespaceBurst is how much they may take at once.
	// Compiling an expression counts as its length.
	NamespaceRate  uint64
	NamespaceBurst uint64
	// MemoEntries bounds the memo (one entry per expression and device).
	MemoEntries int
	// Now is the clock (time.Now where nil).
	Now func() time.Time
}

// DefaultOptions: a claim may cost ten times what the API server lets one expression cost on
// one device (about a second of CPU), and a namespace's new evaluations as much as one
// expression at that limit per second (about a tenth of a CPU) on average, and one claim's
// budget at once.
func DefaultOptions(driver string) Options {
	return Options{
		Driver:         driver,
		ClaimBudget:    10 * resourceapi.CELSelectorExpressionMaxCost,
		NamespaceRate:  resourceapi.CELSelectorExpressionMaxCost,
		NamespaceBurst: 10 * resourceapi.CELSelectorExpressionMaxCost,
		MemoEntries:    1 << 18,
	}
}

// TooCostlyError refuses a claim whose selectors cost more than the claim budget.
type TooCostlyError struct {
	Spent, Budget uint64
	Devices       int
}

func (e *TooCostlyError) Error() string {
	return fmt.Sprintf("the claim's device selectors cost more than the allocator evaluates for one claim (over %d CEL cost units on %d device(s), the limit is %d): use fewer or simpler selectors, then delete and recreate the claim",
		e.Spent, e.Devices, e.Budget)
}

// ThrottledError asks to evaluate a claim's selectors again after RetryAfter: its namespace
// has spent its share of evaluation, or (Busy) as many of its claims as may be are being
// evaluated now.
type ThrottledError struct {
	Namespace  string
	RetryAfter time.Duration
	Busy       bool
}

func (e *ThrottledError) Error() string {
	if e.Busy {
		return fmt.Sprintf("%d claims of namespace %s are having their device selectors evaluated; this one waits for them", maxInFlight, e.Namespace)
	}
	return fmt.Sprintf("the device selectors of namespace %s's claims took their share of the allocator's time; this claim's are evaluated in %s",
		e.Namespace, e.RetryAfter.Round(time.Millisecond))
}

// Matches says, per device, whether one list of selectors matched it.
type Matches struct {
	all   bool // no selectors: every device matches
	byKey map[string]match
}

type match struct {
	version uint64
	ok      bool
	failed  string // the selector that could not be evaluated, and why
}

// At says whether the selectors matched device key at version; known is false where the
// device was not evaluated at that version (it appeared or changed after the snapshot).
func (m Matches) At(key string, version uint64) (ok bool, failed string, known bool) {
	if m.all {
		return true, "", true
	}
	r, found := m.byKey[key]
	if !found || r.version != version {
		return false, "", false
	}
	return r.ok, r.failed, true
}

// Evaluator evaluates and memoises selectors. It is safe for concurrent use; its lock is
// its own and is never held while an expression is compiled or evaluated.
type Evaluator struct {
	opts Options
	cel  *cel.Cache

	mu      sync.Mutex
	exprs   map[string]*list.Element // of *exprMemo, most recently used first
	lru     list.List
	entries int
	parked  map[string]parkedClaim // claim key → why it is refused
	spaces  map[string]*bucket     // namespace → its evaluation time
}

type exprMemo struct {
	expr     string
	byDevice map[string]verdict
}

type verdict struct {
	version uint64
	ok      bool
	cost    uint64
	err     string
}

type parkedClaim struct {
	uid types.UID
	err error
}

// bucket is a namespace's share: tokens are the CEL cost it may still spend now; inFlight
// counts its claims being evaluated.
type bucket struct {
	tokens   float64
	at       time.Time
	inFlight int
}

// maxInFlight bounds a namespace's claims evaluated at once: what they cost is charged
// after, so this bounds how far past its share a namespace can go.
const maxInFlight = 4

// New makes an Evaluator.
func New(opts Options) *Evaluator {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Evaluator{opts: opts, cel: cel.NewCache(1024, cel.Features{EnableConsumableCapacity: true}),
		exprs: map[string]*list.Element{}, parked: map[string]parkedClaim{}, spaces: map[string]*bucket{}}
}

// Claim evaluates each list of selectors (a list matches a device where all its selectors
// do) on devs, for the claim key of namespace ns with uid. It returns one Matches per list,
// a *TooCostlyError, or a *ThrottledError.
func (e *Evaluator) Claim(ctx context.Context, ns, key string, uid types.UID, lists [][]resourceapi.DeviceSelector, devs []Device) ([]Matches, error) {
	exprs := make([][]string, len(lists))
	n := 0
	for i, sels := range lists {
		for _, s := range sels {
			if s.CEL != nil {
				exprs[i] = append(exprs[i], s.CEL.Expression)
				n++
			}
		}
	}
	out := make([]Matches, len(lists))
	if n == 0 {
		for i := range out {
			out[i].all = true
		}
		return out, nil
	}
	if err := e.enter(ns, key, uid); err != nil {
		return nil, err
	}
	var spent cost
	var err error
	for i := range exprs {
		if out[i], err = e.list(ctx, exprs[i], devs, &spent); err != nil {
			break
		}
	}
	e.leave(ns, spent.fresh)
	if tc, ok := err.(*TooCostlyError); ok {
		tc.Devices = len(devs)
		e.mu.Lock()
		e.parked[key] = parkedClaim{uid: uid, err: tc}
		e.mu.Unlock()
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Forget drops what is kept about a claim (it was placed or deleted).
func (e *Evaluator) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.parked, key)
}

// enter refuses a parked claim, or starts an evaluation for namespace ns where its share
// allows: while it has some left, and for at most maxInFlight of its claims at once.
func (e *Evaluator) enter(ns, key string, uid types.UID) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.parked[key]; ok {
		if p.uid == uid {
			return p.err
		}
		delete(e.parked, key) // a new claim of the same name
	}
	b := e.spaces[ns]
	now := e.opts.Now()
	burst, rate := float64(e.opts.NamespaceBurst), float64(e.opts.NamespaceRate)
	if b == nil {
		b = &bucket{tokens: burst, at: now}
		e.spaces[ns] = b
	}
	b.tokens = math.Min(burst, b.tokens+now.Sub(b.at).Seconds()*rate)
	b.at = now
	switch {
	case b.inFlight >= maxInFlight:
		return &ThrottledError{Namespace: ns, RetryAfter: 20 * time.Millisecond, Busy: true}
	case b.tokens <= 0:
		return &ThrottledError{Namespace: ns, RetryAfter: time.Duration((-b.tokens/rate + 0.01) * float64(time.Second))}
	}
	b.inFlight++
	return nil
}

// leave ends a namespace's evaluation, which cost it fresh.
func (e *Evaluator) leave(ns string, fresh uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.spaces[ns]
	b.inFlight--
	b.tokens -= float64(fresh)
}

// cost is what a claim's evaluation cost: all, memoised or not, for the claim budget; fresh,
// what was evaluated or compiled now, for its namespace's share.
type cost struct{ all, fresh uint64 }

// list evaluates one list of selectors on every device, adding their cost to spent. A
// device's selectors stop at the first that does not match, as kube-scheduler's do.
func (e *Evaluator) list(ctx context.Context, exprs []string, devs []Device, spent *cost) (Matches, error) {
	m := Matches{byKey: make(map[string]match, len(devs))}
	if len(exprs) == 0 {
		m.all = true
		return m, nil
	}
	for _, d := range devs {
		r := match{version: d.Version, ok: true}
		for _, x := range exprs {
			v := e.verdict(ctx, x, d, spent)
			if spent.all += v.cost; spent.all > e.opts.ClaimBudget {
				return Matches{}, &TooCostlyError{Spent: spent.all, Budget: e.opts.ClaimBudget}
			}
			if v.err != "" {
				r.ok, r.failed = false, fmt.Sprintf("selector `%s`: %s", x, v.err)
				break
			}
			if !v.ok {
				r.ok = false
				break
			}
		}
		m.byKey[d.Key] = r
	}
	return m, nil
}

// verdict is expression x's verdict on device d, from the memo or evaluated now; what it
// evaluates or compiles now is added to spent.fresh.
func (e *Evaluator) verdict(ctx context.Context, x string, d Device, spent *cost) verdict {
	v, hit, seen := e.lookup(x, d)
	if hit {
		return v
	}
	if !seen {
		spent.fresh += uint64(len(x))
	}
	defer func() { spent.fresh += v.cost }()
	// Without details (an evaluation that did not start) it counts as the most one
	// expression may cost.
	v = verdict{version: d.Version, cost: resourceapi.CELSelectorExpressionMaxCost}
	res := e.cel.GetOrCompile(x)
	if res.Error != nil {
		v.err, v.cost = fmt.Sprintf("CEL compile error: %v", res.Error), 0
	} else {
		ok, details, err := res.DeviceMatches(ctx, cel.Device{Driver: e.opts.Driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: ptr.To(true)})
		if c := details.ActualCost(); c != nil {
			v.cost = *c
		}
		switch {
		case ctx.Err() != nil:
			return v // cancelled, not a verdict: not memoised
		case err != nil:
			v.err = fmt.Sprintf("CEL runtime error: %v", err)
		default:
			v.ok = ok
		}
	}
	e.store(x, d.Key, v)
	return v
}

// lookup is the memo's verdict of x on d (hit); seen says whether the memo holds x at all.
func (e *Evaluator) lookup(x string, d Device) (v verdict, hit, seen bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	el, ok := e.exprs[x]
	if !ok {
		return verdict{}, false, false
	}
	e.lru.MoveToFront(el)
	v, ok = el.Value.(*exprMemo).byDevice[d.Key]
	return v, ok && v.version == d.Version, true
}

func (e *Evaluator) store(x, device string, v verdict) {
	e.mu.Lock()
	defer e.mu.Unlock()
	el, ok := e.exprs[x]
	if !ok {
		el = e.lru.PushFront(&exprMemo{expr: x, byDevice: map[string]verdict{}})
		e.exprs[x] = el
	}
	m := el.Value.(*exprMemo)
	if _, had := m.byDevice[device]; !had {
		e.entries++
	}
	m.byDevice[device] = v
	// Evict the least recently used expressions, never the one just stored.
	for e.entries > e.opts.MemoEntries && e.lru.Back() != el {
		old := e.lru.Remove(e.lru.Back()).(*exprMemo)
		delete(e.exprs, old.expr)
		e.entries -= len(old.byDevice)
	}
}
