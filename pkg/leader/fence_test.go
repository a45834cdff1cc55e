package leader

import (
	"context"
	"errors"
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
	f := NewFence(clk, 10*time.Second)
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
