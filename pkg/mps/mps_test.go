package mps

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// buildStandIn compiles the stand-in control binary, so the test drives the same code path
// the plugin uses with the fake backend.
func buildStandIn(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "fake-mps-control")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/fgpu-dev/fgpu/cmd/fake-mps-control").CombinedOutput()
	if err != nil {
		t.Fatalf("build stand-in: %v\n%s", err, out)
	}
	return bin
}

func TestEnsureStartsConfiguresAndStops(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	d := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "team-a"}
	key := d.Key()
	if m.Running(ctx, key) {
		t.Fatal("daemon running before start")
	}
	if _, err := m.Ensure(ctx, key, d.GPUUUID, Limits{PinnedMemBytes: 10 << 30, ThreadPercent: 40}); err != nil {
		t.Fatal(err)
	}
	if !m.Running(ctx, key) {
		t.Fatal("daemon not running after Ensure")
	}
	st, err := fakecontrol.ReadState(m.LogDir(key))
	if err != nil {
		t.Fatal(err)
	}
	if st.VisibleDevices != "GPU-ABC" || st.DefaultActiveThreadPercentage != "40" || st.DefaultPinnedMemLimit["0"] != "10240M" {
		t.Fatalf("daemon got %+v", st)
	}
	// A second Ensure reuses the daemon and only updates its defaults.
	if _, err := m.Ensure(ctx, key, d.GPUUUID, Limits{PinnedMemBytes: 20 << 30}); err != nil {
		t.Fatal(err)
	}
	st2, _ := fakecontrol.ReadState(m.LogDir(key))
	if st2.PID != st.PID || st2.DefaultPinnedMemLimit["0"] != "20480M" {
		t.Fatalf("Ensure restarted or did not update the daemon: %+v -> %+v", st, st2)
	}
	keys, _ := m.Keys(ctx)
	if len(keys) != 1 || keys[0] != key {
		t.Fatalf("Keys() = %v", keys)
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if m.Running(ctx, key) {
		t.Fatal("daemon still running after Stop")
	}
	if _, err := os.Stat(filepath.Join(m.Root, key)); !os.IsNotExist(err) {
		t.Fatalf("directories left after Stop: %v", err)
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestEnsureRecoversFromStalePipe(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	d := Daemon{GPUUUID: "GPU-1", Namespace: "a", Domain: "default"}
	if err := os.MkdirAll(m.PipeDir(d.Key()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.PipeDir(d.Key()), "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx, d.Key(), d.GPUUUID, Limits{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Stop(ctx, d.Key()); err != nil {
			t.Error(err)
		}
	})
	if !m.Running(ctx, d.Key()) {
		t.Fatal("not running")
	}
}

func TestStopRefusesMalformedKey(t *testing.T) {
	m := &Manager{Root: t.TempDir(), Binary: "false"}
	if err := m.Stop(context.Background(), "../etc"); err == nil {
		t.Fatal("malformed key accepted")
	}
}

// shortDir is a temporary directory with a short path: MPS pipe sockets need one.
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "mps")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func TestKeyIsShortStableAndDistinct(t *testing.T) {
	long := Daemon{GPUUUID: "GPU-7f2dfaf7-66d1-fddc-4f3f-b64f6048037b", Namespace: strings.Repeat("n", 63), Domain: strings.Repeat("a", 63)}
	if k := long.Key(); len(k) > keyMax || !keyRE.MatchString(k) || k != long.Key() {
		t.Fatalf("key %q", k)
	}
	a := Daemon{GPUUUID: "GPU-1", Namespace: "ns", Domain: "x"}
	for _, b := range []Daemon{
		{GPUUUID: "GPU-2", Namespace: "ns", Domain: "x"},
		{GPUUUID: "GPU-1", Namespace: "ns", Domain: "y"},
		{GPUUUID: "GPU-1", Namespace: "other", Domain: "x"},
	} {
		if a.Key() == b.Key() {
			t.Errorf("%+v and %+v share key %s", a, b, a.Key())
		}
	}
}

// A domain is the pair (namespace, sub-domain): no choice of sub-domain in one namespace
// reaches another namespace's daemon, however the names are cut or joined.
func TestKeyKeepsNamespacesApart(t *testing.T) {
	prefix := strings.Repeat("a", 60)
	ns1, ns2 := prefix+"xyz", prefix+"xyw" // 63 characters, the first 60 shared
	seen := map[string]Daemon{}
	for _, d := range []Daemon{
		{GPUUUID: "GPU-1", Namespace: ns1, Domain: "default"},
		{GPUUUID: "GPU-1", Namespace: ns2, Domain: "default"},
		{GPUUUID: "GPU-1", Namespace: "a", Domain: "b-c"},
		{GPUUUID: "GPU-1", Namespace: "a-b", Domain: "c"},
		{GPUUUID: "GPU-1", Namespace: "victim", Domain: "default"},
		{GPUUUID: "GPU-1", Namespace: "attacker", Domain: "victim"},
		{GPUUUID: "GPU-1", Namespace: "attacker", Domain: "ns-victim"},
	} {
		k := d.Key()
		if !keyRE.MatchString(k) {
			t.Errorf("%+v: malformed key %q", d, k)
		}
		if prev, ok := seen[k]; ok {
			t.Errorf("%+v and %+v share key %s", prev, d, k)
		}
		seen[k] = d
	}
	if n := (Daemon{Namespace: "team-a", Domain: "default"}).Name(); n != "team-a/default" {
		t.Errorf("Name() = %q", n)
	}
}

// A plugin upgraded over running claims keeps managing the daemons its checkpoint names
// with the keys of earlier versions.
func TestEarlierKeysStayManageable(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	old := "ns-team-a_0123456789ab"
	if _, err := m.Ensure(ctx, old, "GPU-1", Limits{}); err != nil {
		t.Fatal(err)
	}
	if keys, _ := m.Keys(ctx); len(keys) != 1 || keys[0] != old {
		t.Fatalf("Keys() = %v", keys)
	}
	if err := m.Stop(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(ctx, "../etc", "GPU-1", Limits{}); err == nil {
		t.Fatal("malformed key accepted")
	}
}

// A server in NVIDIA's FAULT state (a client's fatal fault: it refuses new clients until
// all of its clients exited) still answers; FaultedServers names it.
func TestFaultedServers(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	procs := filepath.Join(t.TempDir(), "nvidia0.processes")
	m.DaemonEnv = func(string) []string { return []string{fakecontrol.ProcessFileEnv + "=" + procs} }
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	// A domain's defaults, as its first claim sets them: the stand-in's server runs from then.
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{ThreadPercent: 100}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx, key) })
	if f, err := m.FaultedServers(ctx, key); err != nil || len(f) != 0 {
		t.Fatalf("an ACTIVE server: faulted %v, %v", f, err)
	}
	if err := os.WriteFile(filepath.Join(m.LogDir(key), fakecontrol.FaultFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	st, _ := fakecontrol.ReadState(m.LogDir(key))
	if f, err := m.FaultedServers(ctx, key); err != nil || len(f) != 1 || f[0] != st.PID {
		t.Fatalf("a server in FAULT: faulted %v, %v; want [%d]", f, err, st.PID)
	}
	if !m.Running(ctx, key) {
		t.Error("the faulted server's daemon does not answer")
	}
}

// The longest root CheckRoot accepts still lets the longest key's control socket bind; one
// byte more is refused at start rather than at a tenant's first prepare.
func TestCheckRootMatchesTheSocketLimit(t *testing.T) {
	if err := CheckRoot("/var/run/fgpu/mps"); err != nil {
		t.Fatalf("the default root is refused: %v", err)
	}
	base := shortDir(t)
	pad := socketPathMax - len(filepath.Join(base, "r", strings.Repeat("k", keyMax), "pipe", controlSocket)) + 1
	longest := filepath.Join(base, strings.Repeat("r", pad))
	if err := CheckRoot(longest); err != nil {
		t.Fatalf("a root that fits is refused: %v", err)
	}
	pipe := filepath.Join(longest, strings.Repeat("k", keyMax), "pipe")
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", filepath.Join(pipe, controlSocket))
	if err != nil {
		t.Fatalf("CheckRoot accepted %s but its control socket cannot bind: %v", longest, err)
	}
	l.Close()
	tooLong := longest + "r"
	if err := CheckRoot(tooLong); err == nil || !strings.Contains(err.Error(), "shorter state directory") {
		t.Fatalf("CheckRoot(%d-byte root) = %v, want an error naming the fix", len(tooLong), err)
	}
	pipe = filepath.Join(tooLong, strings.Repeat("k", keyMax), "pipe")
	if err := os.MkdirAll(pipe, 0o755); err != nil {
		t.Fatal(err)
	}
	if l, err := net.Listen("unix", filepath.Join(pipe, controlSocket)); err == nil {
		l.Close()
		t.Fatalf("the kernel binds a socket under %s, which CheckRoot refuses: the limit is wrong", tooLong)
	}
}
