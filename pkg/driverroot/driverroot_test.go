package driverroot

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"

	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// wantMounts is what a container must get from a fake root seen at host path host.
func wantMounts(host string, fr fake.DriverRoot) []cdi.Mount {
	var want []cdi.Mount
	for _, lib := range fr.Libraries {
		want = append(want, cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: "/" + lib, Options: fileOptions})
	}
	for link, lib := range fr.Links {
		want = append(want, cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: "/" + link, Options: fileOptions})
	}
	for _, bin := range fr.Binaries {
		want = append(want, cdi.Mount{HostPath: filepath.Join(host, bin), ContainerPath: "/" + bin, Options: fileOptions})
	}
	for _, s := range fr.Sockets {
		want = append(want, cdi.Mount{HostPath: filepath.Join(host, s), ContainerPath: "/" + s, Options: socketOptions})
	}
	return want
}

func sortMounts(m []cdi.Mount) []cdi.Mount {
	m = slices.Clone(m)
	slices.SortFunc(m, func(a, b cdi.Mount) int { return strings.Compare(a.ContainerPath, b.ContainerPath) })
	return m
}

func checkMounts(t *testing.T, got, want []cdi.Mount) {
	t.Helper()
	got, want = sortMounts(got), sortMounts(want)
	if len(got) != len(want) {
		t.Errorf("got %d mounts, want %d", len(got), len(want))
	}
	for i := range max(len(got), len(want)) {
		var g, w cdi.Mount
		if i < len(got) {
			g = got[i]
		}
		if i < len(want) {
			w = want[i]
		}
		if g.HostPath != w.HostPath || g.ContainerPath != w.ContainerPath || !slices.Equal(g.Options, w.Options) {
			t.Errorf("mount %d: got %+v, want %+v", i, g, w)
		}
	}
}

func TestDiscoverFakeRootAsGPUOperatorDriverContainer(t *testing.T) {
	local := t.TempDir()
	fr, err := fake.LayOutDriverRoot(local)
	if err != nil {
		t.Fatal(err)
	}
	// The plugin sees the host's /run/nvidia/driver at local.
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: "/run/nvidia/driver", Local: local})
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != fr.Version {
		t.Errorf("version %q, want %q", d.Version, fr.Version)
	}
	checkMounts(t, d.Mounts, wantMounts("/run/nvidia/driver", fr))
	// The soname link a CUDA program opens is there, bound to the versioned library.
	if !slices.ContainsFunc(d.Mounts, func(m cdi.Mount) bool {
		return m.ContainerPath == "/usr/lib/x86_64-linux-gnu/libcuda.so.1" && m.HostPath == "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so."+fr.Version
	}) {
		t.Errorf("no libcuda.so.1 bound to libcuda.so.%s: %+v", fr.Version, d.Mounts)
	}
}

func TestDiscoverHostRootSeenInPlace(t *testing.T) {
	root := t.TempDir()
	fr, err := fake.LayOutDriverRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root})
	if err != nil {
		t.Fatal(err)
	}
	want := wantMounts(root, fr)
	// Container paths never carry the root.
	for _, m := range d.Mounts {
		if strings.HasPrefix(m.ContainerPath, root) {
			t.Errorf("container path %s keeps the driver root", m.ContainerPath)
		}
	}
	checkMounts(t, d.Mounts, want)
}

func TestDiscoverLeavesOutWhatIsNotTheDriversOrNotExecutable(t *testing.T) {
	root := t.TempDir()
	fr, err := fake.LayOutDriverRoot(root)
	if err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "libevil.so."+fr.Version)
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	libDir := filepath.Join(root, filepath.Dir(fr.Libraries[0]))
	if err := os.Symlink(outside, filepath.Join(libDir, "libevil.so.1")); err != nil {
		t.Fatal(err)
	}
	// Another version's library and a tool without the executable bit are not mounted.
	if err := os.WriteFile(filepath.Join(libDir, "libnvidia-old.so.1.2.3"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "usr/bin/nvidia-persistenced"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root})
	if err != nil {
		t.Fatal(err)
	}
	checkMounts(t, d.Mounts, wantMounts(root, fr))
}

func TestDiscoverWithoutDriverSaysWhere(t *testing.T) {
	root := t.TempDir()
	_, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: "/run/nvidia/driver", Local: root})
	if err == nil || !strings.Contains(err.Error(), "/run/nvidia/driver") || !strings.Contains(err.Error(), "libcuda.so") {
		t.Fatalf("error %v, want one naming the driver root and libcuda.so", err)
	}
}
