package mps

import (
	"context"
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
	m := &Manager{Root: shortDir(t), Binary: buildStandIn(t)}
	d := Daemon{GPUUUID: "GPU-ABC", Domain: "team-a"}
	key := d.Key()
	if m.Running(ctx, key) {
		t.Fatal("daemon running before start")
	}
	if err := m.Ensure(ctx, d, Limits{PinnedMemBytes: 10 << 30, ThreadPercent: 40}); err != nil {
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
	if err := m.Ensure(ctx, d, Limits{PinnedMemBytes: 20 << 30}); err != nil {
		t.Fatal(err)
	}
	st2, _ := fakecontrol.ReadState(m.LogDir(key))
	if st2.PID != st.PID || st2.DefaultPinnedMemLimit["0"] != "20480M" {
		t.Fatalf("Ensure restarted or did not update the daemon: %+v -> %+v", st, st2)
	}
	keys, _ := m.Keys()
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
	m := &Manager{Root: shortDir(t), Binary: buildStandIn(t)}
	d := Daemon{GPUUUID: "GPU-1", Domain: "default"}
	if err := os.MkdirAll(m.PipeDir(d.Key()), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.PipeDir(d.Key()), "control"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Ensure(ctx, d, Limits{}); err != nil {
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
	long := Daemon{GPUUUID: "GPU-7f2dfaf7-66d1-fddc-4f3f-b64f6048037b", Domain: strings.Repeat("a", 63)}
	if k := long.Key(); len(k) > 33 || !keyRE.MatchString(k) || k != long.Key() {
		t.Fatalf("key %q", k)
	}
	a := Daemon{GPUUUID: "GPU-1", Domain: "x"}
	if a.Key() == (Daemon{GPUUUID: "GPU-2", Domain: "x"}).Key() || a.Key() == (Daemon{GPUUUID: "GPU-1", Domain: "y"}).Key() {
		t.Fatal("keys collide across GPUs or domains")
	}
}
