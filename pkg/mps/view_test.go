package mps

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// viewed opens m's control view, as the plugin does at its start. It needs root (a mount).
func viewed(t *testing.T, m *Manager) *Manager {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("MPS control commands go through a bind mount of the daemon root, which needs root")
	}
	if err := m.OpenControlView(); err != nil {
		t.Fatal(err)
	}
	return m
}

// A tenant replaces its own pipe directory's control socket (mounted read-write into its
// containers) with a relative symlink to another namespace's control socket, whose key it
// can compute. The plugin's commands for the tenant's daemon must not reach the victim's.
func TestControlSymlinkToAnotherDomainIsRefused(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	victim := Daemon{GPUUUID: "GPU-1", Namespace: "team-b", Domain: "default"}.Key()
	attacker := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, victim, "GPU-1", Limits{PinnedMemBytes: 40 << 30, ThreadPercent: 50}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx, victim) })
	if _, err := m.Ensure(ctx, attacker, "GPU-1", Limits{PinnedMemBytes: 10 << 30, ThreadPercent: 20}); err != nil {
		t.Fatal(err)
	}
	attackerState, err := fakecontrol.ReadState(m.LogDir(attacker))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(attackerState.PID, syscall.SIGTERM) })
	ctl := filepath.Join(m.PipeDir(attacker), "control")
	if err := os.Remove(ctl); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..", "..", victim, "pipe", "control"), ctl); err != nil {
		t.Fatal(err)
	}

	_, err = m.ServerPIDs(ctx, attacker)
	if err == nil || !strings.Contains(err.Error(), "is a symlink, not the daemon's socket") {
		t.Errorf("a command for the attacker's daemon: %v, want a refusal naming the symlink", err)
	}
	// Its domain's caps change (a new claim): the plugin sets its daemon's defaults.
	if _, err := m.Ensure(ctx, attacker, "GPU-1", Limits{PinnedMemBytes: 256 << 20, ThreadPercent: 1}); err != nil {
		t.Fatal(err)
	}
	// Its last claim goes: the plugin stops its daemon.
	if err := m.Stop(ctx, attacker); err != nil {
		t.Fatal(err)
	}
	st, err := fakecontrol.ReadState(m.LogDir(victim))
	if err != nil {
		t.Fatal(err)
	}
	if st.DefaultActiveThreadPercentage != "50" || st.DefaultPinnedMemLimit["0"] != "40960M" {
		t.Errorf("the victim's defaults are threads %s, pinned %v; want 50 and 40960M", st.DefaultActiveThreadPercentage, st.DefaultPinnedMemLimit)
	}
	if !m.Running(ctx, victim) {
		t.Error("the attacker's commands stopped the victim's daemon")
	}
}

// The check before a command can be raced: the tenant swaps its socket for a symlink right
// after it. The view is what refuses the symlink when the command connects.
func TestViewRefusesASymlinkSwappedInAfterTheCheck(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	victim := Daemon{GPUUUID: "GPU-1", Namespace: "team-b", Domain: "default"}.Key()
	attacker := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, victim, "GPU-1", Limits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx, victim) })
	if err := os.MkdirAll(m.PipeDir(attacker), 0o755); err != nil {
		t.Fatal(err)
	}
	ctl := filepath.Join(m.PipeDir(attacker), "control")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: ctl, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	l.Close()
	pipeDir, _, err := m.controlDirs(attacker)
	if err != nil {
		t.Fatalf("a socket: %v", err)
	}
	_ = os.Remove(ctl)
	if err := os.Symlink(filepath.Join("..", "..", victim, "pipe", "control"), ctl); err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("unix", ctl); err != nil {
		t.Fatalf("the symlink does not reach the victim's socket outside the view, so this test shows nothing: %v", err)
	} else {
		c.Close()
	}
	c, err := net.Dial("unix", filepath.Join(pipeDir, "control"))
	if err == nil {
		c.Close()
		t.Fatal("the view followed the tenant's symlink to another domain's control socket")
	}
	if !errors.Is(err, syscall.ELOOP) {
		t.Errorf("dial through the view: %v, want ELOOP", err)
	}
}

// The view is in no mount table: nothing propagates to the host through the plugin's
// Bidirectional state mount, and nothing is left behind when the plugin exits.
func TestViewIsInNoMountTable(t *testing.T) {
	m := viewed(t, &Manager{Root: shortDir(t), Binary: "false"})
	info, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(info), "fgpu-mps-view-") || strings.Contains(string(info), " "+m.Root+" ") {
		t.Errorf("the control view is in the mount table:\n%s", info)
	}
}

// Without the view no control command runs: nothing could stop it from following a
// tenant's symlink.
func TestControlNeedsTheView(t *testing.T) {
	m := &Manager{Root: shortDir(t), Binary: buildStandIn(t)}
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	if _, err := m.ServerPIDs(context.Background(), key); err == nil || !strings.Contains(err.Error(), "OpenControlView") {
		t.Fatalf("a command without the view: %v", err)
	}
}
