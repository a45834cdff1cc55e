// Package selectors evaluates the CEL device selectors of ResourceClaims for the allocator.
//
// A tenant writes the selectors, and the API server accepts up to 8 subrequests of 32
// selectors, each costing up to about 0.1 s per device. So the evaluation is kept away from
// everything that protects other tenants: it runs outside the allocator's model lock, on a
// snapshot of the devices; its verdicts are memoised by expression and device version (no
// interned ids that another claim's expression could inherit), and a claim's are kept until
// the snapshot changes, so passes over pending claims cost nothing; what it costs is bounded
// per claim (a claim whose selectors cost more than Options.ClaimBudget over the cluster's
// devices is refused for good) and per namespace (a namespace whose new evaluations took
// more than its share waits; other namespaces do not); and what it keeps is bounded in bytes.
package selectors

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"
	"unicode"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"
)

// Device is what a selector sees of one device. Version changes whenever its attributes or
// capacity do, so that a memoised verdict is never read for attributes it was not evaluated on.
type Device struct {
	Key        string
	Version    uint64
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	Capacity   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
}

// Snapshot is the devices selectors are evaluated on; Gen names it: a new snapshot after any
// device changed has a new Gen. It is shared, never changed: Matches keep it to read a
// device's verdict.
type Snapshot struct {
	Gen     uint64
	Devices []Device
	index   map[string]int // device key → its index in Devices
}

// NewSnapshot makes snapshot gen of devs, which it keeps: the caller must not change them.
func NewSnapshot(gen uint64, devs []Device) Snapshot {
	index := make(map[string]int, len(devs))
	for i, d := range devs {
		index[d.Key] = i
	}
	return Snapshot{Gen: gen, Devices: devs, index: index}
}

// Options bound what evaluations may cost and keep.
type Options struct {
	// Driver is the domain of attributes named without one.
	Driver string
	// ClaimBudget is the CEL cost (in CEL's cost units, as the API server's per-expression
	// limit counts them, plus evalOverhead per evaluation) that one claim's selectors may
	// take over all devices, memoised or not. Past it the claim is refused until it is
	// deleted.
	ClaimBudget uint64
	// NamespaceRate is the cost per second that a namespace's new work (evaluations and
	// compilations not memoised, memo look-ups) may take on average; NamespaceBurst is how
	// much it may take at once.
	NamespaceRate  uint64
	NamespaceBurst uint64
	// MemoBytes bounds the memo: expressions' text and one entry per device evaluated.
	MemoBytes int
	// KeptBytes bounds the claims' kept results (a byte per device per list of selectors):
	// past it they are dropped, but for refusals, and evaluated again from the memo.
	KeptBytes int
	// Now is the clock (time.Now where nil).
	Now func() time.Time
}

// DefaultOptions: a claim may cost ten times what the API server lets one expression cost on
// one device (about a second of CPU), and a namespace's new work as much as one expression at
// that limit per second (about a tenth of a CPU) on average, one claim's budget at once.
func DefaultOptions(driver string) Options {
	return Options{
		Driver:         driver,
		ClaimBudget:    10 * resourceapi.CELSelectorExpressionMaxCost,
		NamespaceRate:  resourceapi.CELSelectorExpressionMaxCost,
		NamespaceBurst: 10 * resourceapi.CELSelectorExpressionMaxCost,
		MemoBytes:      64 << 20,
		KeptBytes:      32 << 20,
	}
}

// What work costs besides CEL's own units, in those units (about 0.1 µs each on the machines
// the tests run on): building one evaluation's input, and one memo look-up. An evaluation
// costs at least its time, at unitTime a unit, so that the bounds below hold in CPU time.
const (
	unitTime     = 100 * time.Nanosecond
	evalOverhead = 100
	lookupCost   = 5
	// entryBytes is what one memoised verdict takes, with its map's share.
	entryBytes = 64
	// maxText bounds the expression and error text a failure shows.
	maxText = 200
)

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
// evaluated now. The message does not change with RetryAfter, so that a status that shows
// it is not written again at each retry.
type ThrottledError struct {
	Namespace  string
	RetryAfter time.Duration
	Busy       bool
}

func (e *ThrottledError) Error() string {
	if e.Busy {
		return fmt.Sprintf("%d claims of namespace %s are having their device selectors evaluated; this one waits for them", maxInFlight, e.Namespace)
	}
	return fmt.Sprintf("the device selectors of namespace %s's claims took their share of the allocator's time; this claim's wait for it to come back", e.Namespace)
}

// Matches says, for each device of one snapshot, whether one list of selectors matched it.
type Matches struct {
	snap Snapshot
	all  bool    // no selectors: every device matches
	v    []uint8 // by device index: noMatch, match, or failedBase+i for errs[i]
	errs []string
}

const (
	noMatch uint8 = iota
	match
	failedBase
)

// At says whether the selectors matched device key at version; known is false where they
// were not evaluated on it at that version (it came or changed after the snapshot).
func (m Matches) At(key string, version uint64) (ok bool, failed string, known bool) {
	if m.all {
		return true, "", true
	}
	i, found := m.snap.index[key]
	switch {
	case !found || i >= len(m.v) || m.snap.Devices[i].Version != version:
		return false, "", false
	case m.v[i] >= failedBase:
		return false, m.errs[m.v[i]-failedBase], true
	}
	return m.v[i] == match, "", true
}

// Evaluator evaluates and memoises selectors. It is safe for concurrent use; its lock is
// its own and is never held while an expression is compiled or evaluated.
type Evaluator struct {
	opts Options
	cel  *cel.Cache

	mu        sync.Mutex
	exprs     map[string]*exprMemo
	lru       memoList // most recently used first
	bytes     int
	claims    map[string]claimResult // claim key → its last result
	keptBytes int                    // the claims' results' bytes (claimResult.size)
	spaces    map[string]*bucket     // namespace → its share
}

type exprMemo struct {
	expr       string
	byDevice   map[string]verdict
	err        string // the first error it gave, cut to maxText: one per expression
	prev, next *exprMemo
}

// memoList orders the memo's expressions by their last use.
type memoList struct{ front, back *exprMemo }

func (l *memoList) remove(m *exprMemo) {
	if m.prev != nil {
		m.prev.next = m.next
	} else {
		l.front = m.next
	}
	if m.next != nil {
		m.next.prev = m.prev
	} else {
		l.back = m.prev
	}
	m.prev, m.next = nil, nil
}

func (l *memoList) pushFront(m *exprMemo) {
	m.next = l.front
	if l.front != nil {
		l.front.prev = m
	} else {
		l.back = m
	}
	l.front = m
}

func (l *memoList) moveToFront(m *exprMemo) {
	if l.front != m {
		l.remove(m)
		l.pushFront(m)
	}
}

type verdict struct {
	version uint64
	cost    uint64
	result  uint8 // noMatch, match, or failedBase (the error is the expression's)
}

// claimResult is a claim's last result: its Matches on snapshot gen, or why it is refused,
// for the lists of expressions whose hash is lists (a class's selectors may change).
type claimResult struct {
	uid     types.UID
	lists   [sha256.Size]byte
	gen     uint64
	matches []Matches
	err     error
}

// size is what a kept result takes, roughly: its verdicts and error texts, and its entry.
func (r claimResult) size() int {
	n := 0
	if r.uid != "" || r.err != nil || r.matches != nil {
		n = 128
	}
	for _, m := range r.matches {
		n += len(m.v) + 16
		for _, s := range m.errs {
			n += len(s)
		}
	}
	return n
}

// bucket is a namespace's share: tokens are the cost it may still spend now; inFlight
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
		exprs: map[string]*exprMemo{}, claims: map[string]claimResult{}, spaces: map[string]*bucket{}}
}

// Claim evaluates each list of selectors (a list matches a device where all its selectors
// do) on snap, for the claim key of namespace ns with uid. It returns one Matches per list,
// a *TooCostlyError, or a *ThrottledError. A claim's result on one snapshot is kept, and
// given again at no cost, until the snapshot or the claim changes or Forget.
func (e *Evaluator) Claim(ctx context.Context, ns, key string, uid types.UID, lists [][]resourceapi.DeviceSelector, snap Snapshot) ([]Matches, error) {
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
	if n == 0 {
		out := make([]Matches, len(lists))
		for i := range out {
			out[i].all = true
		}
		return out, nil
	}
	sum := listsHash(exprs)
	if r, ok := e.kept(key, uid, sum, snap.Gen); ok {
		return r.matches, r.err
	}
	if err := e.enter(ns); err != nil {
		return nil, err
	}
	var spent cost
	out := make([]Matches, len(lists))
	var err error
	for i := range exprs {
		if out[i], err = e.list(ctx, exprs[i], snap, &spent); err != nil {
			break
		}
	}
	e.leave(ns, spent.fresh)
	var tc *TooCostlyError
	switch {
	case errors.As(err, &tc):
		tc.Devices = len(snap.Devices)
		e.keep(key, claimResult{uid: uid, lists: sum, err: tc})
		return nil, tc
	case err != nil:
		return nil, err
	}
	e.keep(key, claimResult{uid: uid, lists: sum, gen: snap.Gen, matches: out})
	return out, nil
}

// Forget drops what is kept about a claim (it was placed or deleted).
func (e *Evaluator) Forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.keptBytes -= e.claims[key].size()
	delete(e.claims, key)
}

// kept is the claim's kept result for the same lists of expressions: a refusal whatever the
// snapshot (its cost only grows with devices), or its matches on snapshot gen.
func (e *Evaluator) kept(key string, uid types.UID, lists [sha256.Size]byte, gen uint64) (claimResult, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r, ok := e.claims[key]
	if !ok || r.uid != uid || r.lists != lists || (r.err == nil && r.gen != gen) {
		return claimResult{}, false
	}
	return r, true
}

// listsHash identifies lists of expressions, their order and where each list ends.
func listsHash(exprs [][]string) [sha256.Size]byte {
	h := sha256.New()
	var n [8]byte
	for _, l := range exprs {
		binary.LittleEndian.PutUint64(n[:], uint64(len(l)))
		h.Write(n[:])
		for _, x := range l {
			binary.LittleEndian.PutUint64(n[:], uint64(len(x)))
			h.Write(n[:])
			h.Write([]byte(x))
		}
	}
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

func (e *Evaluator) keep(key string, r claimResult) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.keptBytes -= e.claims[key].size()
	delete(e.claims, key)
	if e.opts.KeptBytes > 0 && e.keptBytes+r.size() > e.opts.KeptBytes {
		// A tenant's claims with many lists each would otherwise keep a byte per device
		// per list without bound. Refusals stay: their cost is what they park.
		for k, old := range e.claims {
			if old.err == nil {
				e.keptBytes -= old.size()
				delete(e.claims, k)
			}
		}
	}
	e.claims[key] = r
	e.keptBytes += r.size()
}

// enter starts an evaluation for namespace ns where its share allows: while it has some
// left, and for at most maxInFlight of its claims at once.
func (e *Evaluator) enter(ns string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
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
		// At least a second: each retry may write the claim's status.
		// Rounded up, and a nanosecond more: after RetryAfter the share is back above zero.
		back := time.Duration(math.Ceil(-b.tokens/rate*float64(time.Second))) + time.Nanosecond
		return &ThrottledError{Namespace: ns, RetryAfter: max(time.Second, back)}
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
// the work done now, for its namespace's share.
type cost struct{ all, fresh uint64 }

// list evaluates one list of selectors on every device of snap, adding their cost to spent.
// A device's selectors stop at the first that does not match, as kube-scheduler's do.
func (e *Evaluator) list(ctx context.Context, exprs []string, snap Snapshot, spent *cost) (Matches, error) {
	m := Matches{snap: snap, v: make([]uint8, len(snap.Devices))}
	alive := make([]int, len(snap.Devices))
	for i := range alive {
		alive[i] = i
		m.v[i] = match
	}
	for _, x := range exprs {
		verdicts, errText, err := e.expression(ctx, x, snap, alive, spent)
		if err != nil {
			return Matches{}, err
		}
		next := alive[:0]
		failed := uint8(0) // this expression's failure in m.errs, once one device needs it
		for k, i := range alive {
			switch verdicts[k] {
			case match:
				next = append(next, i)
			case noMatch:
				m.v[i] = noMatch
			default:
				if failed == 0 {
					if len(m.errs) < 256-int(failedBase) {
						m.errs = append(m.errs, fmt.Sprintf("selector `%s`: %s", cut(x), errText))
					}
					failed = failedBase + uint8(len(m.errs)-1)
				}
				m.v[i] = failed
			}
		}
		alive = next
		if len(alive) == 0 {
			break
		}
	}
	return m, nil
}

// expression is x's verdict on the devices at indexes at of snap, from the memo or evaluated
// now, and its error text where it failed.
func (e *Evaluator) expression(ctx context.Context, x string, snap Snapshot, at []int, spent *cost) ([]uint8, string, error) {
	out := make([]uint8, len(at))
	missing := make([]int, 0, len(at)) // positions in at
	e.mu.Lock()
	var memo *exprMemo
	if m, ok := e.exprs[x]; ok {
		e.lru.moveToFront(m)
		memo = m
	} else {
		spent.fresh += uint64(len(x)) // compiled anew
	}
	for k, i := range at {
		d := snap.Devices[i]
		spent.fresh += lookupCost
		if memo != nil {
			if v, ok := memo.byDevice[d.Key]; ok && v.version == d.Version {
				out[k] = v.result
				spent.all += v.cost
				continue
			}
		}
		missing = append(missing, k)
	}
	errText := ""
	if memo != nil {
		errText = memo.err
	}
	e.mu.Unlock()
	if spent.all > e.opts.ClaimBudget {
		return nil, "", &TooCostlyError{Spent: spent.all, Budget: e.opts.ClaimBudget}
	}
	if len(missing) == 0 {
		return out, errText, nil
	}
	res := e.cel.GetOrCompile(x)
	fresh := make([]verdict, 0, len(missing))
	for _, k := range missing {
		d := snap.Devices[at[k]]
		v, err := e.evaluate(ctx, res, d)
		if ctx.Err() != nil {
			return nil, "", ctx.Err() // cancelled, not a verdict
		}
		if err != "" && errText == "" {
			errText = err
		}
		spent.all += v.cost
		spent.fresh += v.cost
		out[k] = v.result
		fresh = append(fresh, v)
		if spent.all > e.opts.ClaimBudget {
			e.store(x, snap, at, missing[:len(fresh)], fresh, errText)
			return nil, "", &TooCostlyError{Spent: spent.all, Budget: e.opts.ClaimBudget}
		}
	}
	e.store(x, snap, at, missing, fresh, errText)
	return out, errText, nil
}

// evaluate is compiled expression res's verdict on device d, and its error, cut to maxText.
func (e *Evaluator) evaluate(ctx context.Context, res cel.CompilationResult, d Device) (verdict, string) {
	// Without details (an evaluation that did not start) it counts as the most one
	// expression may cost.
	v := verdict{version: d.Version, cost: evalOverhead + resourceapi.CELSelectorExpressionMaxCost}
	if res.Error != nil {
		v.cost, v.result = evalOverhead, failedBase
		return v, cut(fmt.Sprintf("CEL compile error: %v", res.Error))
	}
	start := time.Now()
	ok, details, err := res.DeviceMatches(ctx, cel.Device{Driver: e.opts.Driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: ptr.To(true)})
	if c := details.ActualCost(); c != nil {
		// CEL's units undercount what an evaluation takes (measured 2-6 times, more with
		// many attributes): it costs at least its time, at unitTime a unit.
		v.cost = max(evalOverhead+*c, uint64(time.Since(start)/unitTime))
	}
	switch {
	case err != nil:
		v.result = failedBase
		return v, cut(fmt.Sprintf("CEL runtime error: %v", err))
	case ok:
		v.result = match
	}
	return v, ""
}

// store memoises x's fresh verdicts (for the devices at positions missing of at), and its
// first error, then evicts the least recently used expressions past the memo's bytes.
func (e *Evaluator) store(x string, snap Snapshot, at, missing []int, fresh []verdict, errText string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	m, ok := e.exprs[x]
	if !ok {
		m = &exprMemo{expr: x, byDevice: map[string]verdict{}}
		e.lru.pushFront(m)
		e.exprs[x] = m
		e.bytes += len(x)
	}
	if m.err == "" {
		m.err = errText
	}
	for j, v := range fresh {
		key := snap.Devices[at[missing[j]]].Key
		if _, had := m.byDevice[key]; !had {
			e.bytes += entryBytes + len(key)
		}
		m.byDevice[key] = v
	}
	for e.bytes > e.opts.MemoBytes && e.lru.back != m {
		old := e.lru.back
		e.lru.remove(old)
		delete(e.exprs, old.expr)
		e.bytes -= len(old.expr)
		for key := range old.byDevice {
			e.bytes -= entryBytes + len(key)
		}
	}
}

// cut shortens text a tenant wrote to what a message shows.
func cut(s string) string {
	// The tenant wrote it, and it is shown in fgpu's status and events: no control
	// characters for an admin's terminal.
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	if len(s) <= maxText {
		return s
	}
	return strings.ToValidUTF8(s[:maxText], "") + "…"
}
