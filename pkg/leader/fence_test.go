package leader

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	testingclock "k8s.io/utils/clock/testing"
)

// fakeLock is a resourcelock.Interface whose writes fail when err is set.
type fakeLock struct {
	resourcelock.Interface
	err error
}

func (l *fakeLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }
func (l *fakeLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return l.err }
func (l *fakeLock) Identity() string                                                { return "me" }

func TestFenceClosesAtRenewDeadline(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	f := NewFence(clk, 10*time.Second, 15*time.Second)
	inner := &fakeLock{}
	lock := f.Lock(inner)
	ctx := context.Background()
	if err := f.Allow(); !errors.Is(err, ErrFenced) {
		t.Fatalf("before leading: %v", err)
	}
	if err := lock.Create(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	clk.Step(9 * time.Second)
	if err := f.Allow(); err != nil {
		t.Fatalf("9s after acquiring, deadline 10s: %v", err)
	}
	// A renew that fails does not extend the fence.
	inner.err = errors.New("conflict")
	_ = lock.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"})
	clk.Step(time.Second)
	err := f.Allow()
	if !errors.Is(err, ErrFenced) || !strings.Contains(err.Error(), "renew deadline 10s") {
		t.Fatalf("10s after the last successful renew: %v", err)
	}
	// A successful renew opens it again, from when it was sent.
	inner.err = nil
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	if err := f.Allow(); err != nil {
		t.Fatalf("just renewed: %v", err)
	}
	// Releasing (another holder, here none) closes it at once.
	_ = lock.Update(ctx, resourcelock.LeaderElectionRecord{})
	if err := f.Allow(); !errors.Is(err, ErrFenced) {
		t.Fatalf("after release: %v", err)
	}
}

func TestValidateTimings(t *testing.T) {
	for _, tc := range []struct {
		lease, renew, retry time.Duration
		want                string
	}{
		{15 * time.Second, 10 * time.Second, 2 * time.Second, ""},
		{10 * time.Second, 10 * time.Second, 2 * time.Second, "--leader-elect-lease-duration (10s) must be greater than --leader-elect-renew-deadline (10s)"},
		{15 * time.Second, 10 * time.Second, 9 * time.Second, "--leader-elect-renew-deadline (10s) must be greater than 1.2 × --leader-elect-retry-period (9s)"},
		{15 * time.Second, 0, time.Second, "must be positive"},
	} {
		err := ValidateTimings(tc.lease, tc.renew, tc.retry)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s/%s/%s: %v, want %q", tc.lease, tc.renew, tc.retry, err, tc.want)
		}
	}
}

// rtFunc is an http.RoundTripper.
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A write goes out with a deadline at the last renew plus the lease duration (when another
// replica may lead), is refused once the fence closed, and is cancelled if it is still on
// its way at that deadline; reads are not fenced.
func TestFencedTransportBoundsWrites(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	f := NewFence(clk, 10*time.Second, 15*time.Second)
	var deadline time.Time
	var sent int
	block := false
	inner := rtFunc(func(r *http.Request) (*http.Response, error) {
		sent++
		deadline, _ = r.Context().Deadline()
		if block {
			<-r.Context().Done()
			return nil, r.Context().Err()
		}
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(""))}, nil
	})
	rt := f.WrapTransport(inner)
	do := func(method string) error {
		req, _ := http.NewRequestWithContext(context.Background(), method, "https://api/x", nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return err
	}
	if err := do(http.MethodPost); !errors.Is(err, ErrFenced) || sent != 0 {
		t.Fatalf("write before leading: %v, sent %d", err, sent)
	}
	if err := do(http.MethodGet); err != nil || sent != 1 || !deadline.IsZero() {
		t.Fatalf("read: %v, sent %d, deadline %v", err, sent, deadline)
	}
	if err := f.Lock(&fakeLock{}).Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	clk.Step(4 * time.Second)
	before := time.Now()
	if err := do(http.MethodPut); err != nil || sent != 2 {
		t.Fatalf("write 4s after the renew: %v, sent %d", err, sent)
	}
	if left := deadline.Sub(before); left < 11*time.Second-100*time.Millisecond || left > 11*time.Second+100*time.Millisecond {
		t.Fatalf("write 4s after the renew, lease 15s: deadline in %s, want 11s", left)
	}
	clk.Step(6 * time.Second)
	if err := do(http.MethodPatch); !errors.Is(err, ErrFenced) || sent != 2 {
		t.Fatalf("write at the renew deadline: %v, sent %d", err, sent)
	}

	// With a lease 20ms longer than the renew deadline, a write sent just before the
	// fence closes is cancelled 20ms later on the real clock.
	f = NewFence(clk, 10*time.Second, 10*time.Second+20*time.Millisecond)
	rt = f.WrapTransport(inner)
	if err := f.Lock(&fakeLock{}).Update(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	clk.Step(10*time.Second - time.Millisecond)
	block = true
	start := time.Now()
	if err := do(http.MethodDelete); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("write still in flight when another replica may lead: %v after %s", err, time.Since(start))
	}
}

// recordingLock records when its Update was called.
type recordingLock struct {
	fakeLock
	updated chan resourcelock.LeaderElectionRecord
}

func (l *recordingLock) Update(_ context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.updated <- ler
	return nil
}

// A release (ReleaseOnCancel on a graceful shutdown) lets another replica lead at once, so
// it is sent only once the writes already let through have been answered; where they are
// not answered within the release's context, the Lease is not released (it expires).
func TestReleaseWaitsForWritesInFlight(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Unix(1000, 0))
	f := NewFence(clk, 10*time.Second, 15*time.Second)
	inner := &recordingLock{updated: make(chan resourcelock.LeaderElectionRecord, 2)}
	lock := f.Lock(inner)
	if err := lock.Create(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	sent, answer := make(chan struct{}), make(chan struct{})
	rt := f.WrapTransport(rtFunc(func(r *http.Request) (*http.Response, error) {
		close(sent)
		<-answer
		return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader(""))}, nil
	}))
	written := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, "https://api/x", nil)
		resp, err := rt.RoundTrip(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		written <- err
	}()
	<-sent

	released := make(chan error, 1)
	go func() { released <- lock.Update(context.Background(), resourcelock.LeaderElectionRecord{}) }()
	select {
	case <-inner.updated:
		t.Fatal("the Lease was released while a write was in flight")
	case <-time.After(100 * time.Millisecond):
	}
	if err := f.Allow(); !errors.Is(err, ErrFenced) {
		t.Fatalf("writes allowed while releasing: %v", err)
	}
	close(answer)
	if err := <-written; err != nil {
		t.Fatal(err)
	}
	select {
	case <-inner.updated:
	case <-time.After(5 * time.Second):
		t.Fatal("the release was not sent once the write was answered")
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}

	// A write that is never answered within the release's context: no release.
	if err := lock.Create(context.Background(), resourcelock.LeaderElectionRecord{HolderIdentity: "me"}); err != nil {
		t.Fatal(err)
	}
	sent, answer = make(chan struct{}), make(chan struct{})
	defer close(answer)
	go func() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, "https://api/x", nil)
		_, err := rt.RoundTrip(req)
		written <- err
	}()
	<-sent
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{}); err == nil || !strings.Contains(err.Error(), "1 write(s) still in flight; not releasing the leader Lease") {
		t.Fatalf("release with a write in flight past its context: %v", err)
	}
	select {
	case <-inner.updated:
		t.Fatal("the Lease was released while a write was in flight")
	default:
	}
}
