// Package leader fences the allocator's writes to the time it is surely the only leader.
//
// client-go's leader election lets another replica take the Lease only LeaseDuration after
// it last saw this one renew, while this replica's elector may go on believing it leads
// for up to RenewDeadline plus a RetryPeriod after its last successful renew (and its
// workers may still be mid-write when it gives up). Two leaders could then write at once,
// guarded only by each claim's resourceVersion, not by what is on the GPU. A Fence refuses
// writes once RenewDeadline has passed since the last renew that succeeded, and gives each
// write it lets through a deadline LeaseDuration after that renew: a write that waits in the
// client's rate limiter or on a slow connection is cancelled rather than sent once another
// replica may lead (one the API server already received may still be applied). Releasing
// the Lease on a graceful shutdown lets another replica lead at once, so the release waits
// until the writes the fence let through have been answered.
package leader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ErrFenced is what Allow returns (wrapped) when this replica may no longer write.
var ErrFenced = errors.New("not the leader")

// Fence records when this replica last renewed its Lease and says whether it may write.
type Fence struct {
	clock    clock.PassiveClock
	deadline time.Duration
	lease    time.Duration

	mu       sync.Mutex
	renewed  time.Time     // when the last successful renew was sent; zero: never, or released
	inflight int           // fenced writes sent and not yet answered
	idle     chan struct{} // closed when inflight drops to zero
}

// NewFence is a fence that closes renewDeadline after the last successful renew and cancels
// writes leaseDuration after it.
func NewFence(c clock.PassiveClock, renewDeadline, leaseDuration time.Duration) *Fence {
	return &Fence{clock: c, deadline: renewDeadline, lease: leaseDuration}
}

// Allow returns nil while this replica holds the Lease with a renew younger than the renew
// deadline, and an error wrapping ErrFenced otherwise.
func (f *Fence) Allow() error {
	_, err := f.check()
	return err
}

// check is Allow, with the renew it judged by.
func (f *Fence) check() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.checkLocked()
}

func (f *Fence) checkLocked() (time.Time, error) {
	renewed := f.renewed
	if renewed.IsZero() {
		return renewed, fmt.Errorf("%w: this replica does not hold the leader Lease; refusing to write", ErrFenced)
	}
	if age := f.clock.Since(renewed); age >= f.deadline {
		return renewed, fmt.Errorf("%w: the leader Lease was last renewed %s ago, at or past the renew deadline %s; refusing to write", ErrFenced, age.Round(time.Millisecond), f.deadline)
	}
	return renewed, nil
}

// Context returns ctx bounded by the time another replica may take the Lease (LeaseDuration
// after the last successful renew), or Allow's error.
func (f *Fence) Context(ctx context.Context) (context.Context, context.CancelFunc, error) {
	renewed, err := f.check()
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := f.bound(ctx, renewed)
	return ctx, cancel, nil
}

func (f *Fence) bound(ctx context.Context, renewed time.Time) (context.Context, context.CancelFunc) {
	// The clock may be a fake one; the context's deadline is on the real clock.
	return context.WithTimeout(ctx, renewed.Add(f.lease).Sub(f.clock.Now()))
}

// begin is Allow for a write about to be sent, which counts as in flight (a release waits
// for it) until end is called. One lock for both: a release that closes the fence after
// begin sees the write.
func (f *Fence) begin() (time.Time, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	renewed, err := f.checkLocked()
	if err != nil {
		return renewed, err
	}
	if f.inflight == 0 {
		f.idle = make(chan struct{})
	}
	f.inflight++
	return renewed, nil
}

func (f *Fence) end() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.inflight--; f.inflight == 0 {
		close(f.idle)
	}
}

// drain waits until no write the fence let through is still waiting for its answer, or until
// ctx is done. Each such write is cancelled at its own deadline, so the wait is bounded by
// them too.
func (f *Fence) drain(ctx context.Context) error {
	f.mu.Lock()
	n, idle := f.inflight, f.idle
	f.mu.Unlock()
	if n == 0 {
		return nil
	}
	klog.FromContext(ctx).Info("Waiting for the allocator's writes in flight before releasing the leader Lease", "writes", n)
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%d write(s) still in flight; not releasing the leader Lease, so other replicas take it only once it expires: %w", n, context.Cause(ctx))
	}
}

// WrapTransport fences every request that writes (any method but GET, HEAD and OPTIONS) as
// it is sent, after the client's rate limiter: refused once the fence is closed, cancelled at
// the Context deadline. Reads (lists and watches among them) pass as they are. For the
// controller's clients only: the Lease's own renews must not be fenced.
func (f *Fence) WrapTransport(rt http.RoundTripper) http.RoundTripper {
	return &fencedTransport{rt: rt, fence: f}
}

type fencedTransport struct {
	rt    http.RoundTripper
	fence *Fence
}

func (t *fencedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return t.rt.RoundTrip(req)
	}
	renewed, err := t.fence.begin()
	if err != nil {
		return nil, err
	}
	// The API server has applied the write, or will not, once it answers.
	defer t.fence.end()
	ctx, cancel := t.fence.bound(req.Context(), renewed)
	resp, err := t.rt.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose releases the request's context once its response is read.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// Lock wraps the elector's lock: a Create or Update that writes this replica as the holder
// and succeeds renews the fence, from the time it was sent (others count LeaseDuration from
// when they see it, which is later); one that writes another holder (a release, which
// ReleaseOnCancel makes on a graceful shutdown) closes it, and is sent only once the writes
// the fence let through have been answered: a released Lease lets another replica lead at
// once. If they are not answered within the release's context, the release fails and the
// Lease expires as if the replica had died.
func (f *Fence) Lock(inner resourcelock.Interface) resourcelock.Interface {
	return &fencedLock{Interface: inner, fence: f}
}

type fencedLock struct {
	resourcelock.Interface
	fence *Fence
}

func (l *fencedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.record(ctx, ler, l.Interface.Create)
}

func (l *fencedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.record(ctx, ler, l.Interface.Update)
}

func (l *fencedLock) record(ctx context.Context, ler resourcelock.LeaderElectionRecord, write func(context.Context, resourcelock.LeaderElectionRecord) error) error {
	sent := l.fence.clock.Now()
	if ler.HolderIdentity != l.Identity() {
		l.fence.set(time.Time{}) // releasing: stop writing before the record says so
		if err := l.fence.drain(ctx); err != nil {
			return err
		}
	}
	err := write(ctx, ler)
	if err == nil && ler.HolderIdentity == l.Identity() {
		l.fence.set(sent)
	}
	return err
}

func (f *Fence) set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.renewed = t
}

// ValidateTimings checks the leader-election durations as client-go needs them, with the
// flags' names: lease duration > renew deadline > retry period × client-go's jitter factor.
// The gap between lease duration and renew deadline is the fence's margin.
func ValidateTimings(leaseDuration, renewDeadline, retryPeriod time.Duration) error {
	if renewDeadline <= 0 || retryPeriod <= 0 {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) and --leader-elect-retry-period (%s) must be positive", renewDeadline, retryPeriod)
	}
	if leaseDuration <= renewDeadline {
		return fmt.Errorf("--leader-elect-lease-duration (%s) must be greater than --leader-elect-renew-deadline (%s): the difference is how long a deposed leader's last write has to land before another replica may lead", leaseDuration, renewDeadline)
	}
	if float64(renewDeadline) <= leaderelection.JitterFactor*float64(retryPeriod) {
		return fmt.Errorf("--leader-elect-renew-deadline (%s) must be greater than %.1f × --leader-elect-retry-period (%s)", renewDeadline, leaderelection.JitterFactor, retryPeriod)
	}
	return nil
}
