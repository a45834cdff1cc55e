package fake

import (
	"os"
	"path/filepath"
	"testing"
)

func TestLayOutDriverRootTwiceIntoItsOwnDirectory(t *testing.T) {
	root := filepath.Join(t.TempDir(), "fake-driver")
	for i := range 2 {
		if _, err := LayOutDriverRoot(root); err != nil {
			t.Fatalf("layout %d: %v", i+1, err)
		}
	}
	if info, err := os.Lstat(filepath.Join(root, DriverRootMarker)); err != nil || !info.Mode().IsRegular() {
		t.Errorf("no %s marker: %v", DriverRootMarker, err)
	}
}

// A node keeps the layout of a plugin from before the marker: the upgraded plugin takes it.
func TestLayOutDriverRootOverAnUnmarkedEarlierLayout(t *testing.T) {
	root := t.TempDir()
	if _, err := LayOutDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, DriverRootMarker)); err != nil {
		t.Fatal(err)
	}
	if _, err := LayOutDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(root, DriverRootMarker)); err != nil {
		t.Errorf("the earlier layout is not marked now: %v", err)
	}
}

// --gpus=fake:... with --driver-root naming a real driver (a GPU Operator's /run/nvidia/driver)
// must leave that driver alone.
func TestLayOutDriverRootRefusesARealDriver(t *testing.T) {
	root := t.TempDir()
	lib := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	for _, dir := range []string{lib, filepath.Join(root, "usr/bin")} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/nvidia-smi"), []byte("REAL nvidia-smi"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(lib, "libcuda.so.550.54.15"), []byte("REAL"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("libcuda.so.550.54.15", filepath.Join(lib, "libcuda.so.1")); err != nil {
		t.Fatal(err)
	}
	if _, err := LayOutDriverRoot(root); err == nil {
		t.Error("a directory holding a real driver was accepted")
	}
	if b, _ := os.ReadFile(filepath.Join(root, "usr/bin/nvidia-smi")); string(b) != "REAL nvidia-smi" {
		t.Errorf("real nvidia-smi overwritten: %q", b)
	}
	if l, _ := os.Readlink(filepath.Join(lib, "libcuda.so.1")); l != "libcuda.so.550.54.15" {
		t.Errorf("real libcuda.so.1 relinked to %s", l)
	}
	if _, err := os.Lstat(filepath.Join(root, DriverRootMarker)); err == nil {
		t.Errorf("the real driver's root was marked as a fake one")
	}
}

// A symlink planted in a fake root is not written through, as a file or as a directory.
func TestLayOutDriverRootFollowsNoSymlink(t *testing.T) {
	root := t.TempDir()
	if _, err := LayOutDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	outside := t.TempDir()
	victim := filepath.Join(outside, "nvidia-smi")
	if err := os.WriteFile(victim, []byte("REAL nvidia-smi"), 0o755); err != nil {
		t.Fatal(err)
	}
	smi := filepath.Join(root, "usr/bin/nvidia-smi")
	if err := os.Remove(smi); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, smi); err != nil {
		t.Fatal(err)
	}
	if _, err := LayOutDriverRoot(root); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "REAL nvidia-smi" {
		t.Errorf("written through the nvidia-smi link: %q", b)
	}
	if info, err := os.Lstat(smi); err != nil || !info.Mode().IsRegular() {
		t.Errorf("nvidia-smi is not the fake's own file again: %v", err)
	}

	socketDir := filepath.Join(root, "run/nvidia-persistenced")
	if err := os.RemoveAll(socketDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, socketDir); err != nil {
		t.Fatal(err)
	}
	if _, err := LayOutDriverRoot(root); err == nil {
		t.Error("a directory symlink in the root was followed without complaint")
	}
	if _, err := os.Lstat(filepath.Join(outside, "socket")); err == nil {
		t.Error("written through the run/nvidia-persistenced link")
	}
}
