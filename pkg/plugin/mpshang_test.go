package plugin

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// hang replaces daemon key's control socket with one that accepts and never answers, as a
// tenant can (its pipe directory is mounted read-write into its containers): every control
// command for that daemon waits its whole timeout. The daemon itself is killed at cleanup.
func hang(t *testing.T, s *State, key string) {
	t.Helper()
	st, err := fakecontrol.ReadState(s.daemons.mps.LogDir(key))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(st.PID, syscall.SIGTERM) })
	ctl := filepath.Join(s.daemons.mps.PipeDir(key), "control")
	if err := os.Remove(ctl); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
}

// A tenant's control socket that never answers is its own domain's problem: while the
// plugin stops that daemon (its last claim unprepared), looks for foreign processes and
// checks the MPS daemons, another namespace's prepare does not wait for its commands.
func TestHangingControlSocketDoesNotDelayOtherNamespaces(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	s.daemons.mps.Timeout = 2 * time.Second
	ctx := context.Background()
	a := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	keys, err := s.daemons.mps.DirKeys()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	hang(t, s, keys[0])
	unprepared := make(chan error, 1)
	go func() { unprepared <- s.Unprepare(ctx, string(a.UID)) }()
	go s.RefreshForeign(ctx)
	go s.CheckMPS(ctx)
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-b", "b1").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ns-b's prepare waited %v for ns-a's control socket (command timeout %v)", d, s.daemons.mps.Timeout)
	}
	if err := <-unprepared; err != nil {
		t.Errorf("ns-a's unprepare: %v", err)
	}
}

// The MPS check asks the daemons concurrently: several domains whose control sockets never
// answer cost one command timeout, not one each.
func TestMPSCheckAsksDaemonsConcurrently(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	s.daemons.mps.Timeout = 2 * time.Second
	ctx := context.Background()
	for _, ns := range []string{"ns-a", "ns-b", "ns-c"} {
		if _, err := s.Prepare(ctx, builders.MakeClaim(ns, "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := s.daemons.mps.DirKeys()
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	for _, k := range keys {
		hang(t, s, k)
	}
	start := time.Now()
	s.CheckMPS(ctx)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the MPS check of 3 domains whose sockets do not answer took %v (command timeout %v)", d, s.daemons.mps.Timeout)
	}
}
