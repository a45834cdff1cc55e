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
	// Each library and link at its own path and again in ImageLibDir.
	for _, lib := range fr.Libraries {
		want = append(want,
			cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: "/" + lib, Options: fileOptions},
			cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: filepath.Join(ImageLibDir, filepath.Base(lib)), Options: fileOptions})
	}
	for link, lib := range fr.Links {
		want = append(want,
			cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: "/" + link, Options: fileOptions},
			cdi.Mount{HostPath: filepath.Join(host, lib), ContainerPath: filepath.Join(ImageLibDir, filepath.Base(link)), Options: fileOptions})
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
	// The plugin's NVML loads the root's library, where the plugin sees it.
	if want := filepath.Join(local, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so."+fr.Version); d.NVML != want {
		t.Errorf("NVML library %q, want %q", d.NVML, want)
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

// layOutLibs writes regular files and relative or absolute links into a library directory.
func layOutLibs(t *testing.T, dir string, files []string, links map[string]string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for link, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, link)); err != nil {
			t.Fatal(err)
		}
	}
}

func hasMount(mounts []cdi.Mount, containerPath, hostPath string) bool {
	return slices.ContainsFunc(mounts, func(m cdi.Mount) bool {
		return m.ContainerPath == containerPath && m.HostPath == hostPath
	})
}

// An upgrade can leave an older libcuda next to the current one; the lexically first is the
// old one, libcuda.so.1 names the current one.
func TestDiscoverTakesTheSonameLinksVersionOverALeftoverOlderLibrary(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
	layOutLibs(t, dir, []string{"libcuda.so.535.104.05", "libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"},
		map[string]string{"libcuda.so.1": "libcuda.so.550.54.15", "libnvidia-ml.so.1": "libnvidia-ml.so.550.54.15"})
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root, Proc: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "550.54.15" {
		t.Errorf("version %s, want 550.54.15", d.Version)
	}
	if !hasMount(d.Mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", filepath.Join(dir, "libcuda.so.550.54.15")) {
		t.Errorf("no libcuda.so.1 bound to libcuda.so.550.54.15: %+v", d.Mounts)
	}
	if hasMount(d.Mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05", filepath.Join(dir, "libcuda.so.535.104.05")) {
		t.Errorf("the leftover older library is mounted: %+v", d.Mounts)
	}
}

// Without a soname link the highest version wins, by number: 96.43.23 < 535.104.05 < 550.54.15.
func TestDiscoverWithoutSonameLinkTakesTheHighestVersion(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib64")
	layOutLibs(t, dir, []string{"libcuda.so.535.104.05", "libcuda.so.550.54.15", "libcuda.so.96.43.23"}, nil)
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root, Proc: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if d.Version != "550.54.15" {
		t.Errorf("version %s, want 550.54.15", d.Version)
	}
}

// The loaded kernel module decides: user space must match it, whatever libcuda.so.1 says.
func TestDiscoverTakesTheLoadedKernelModulesVersion(t *testing.T) {
	for name, nvrm := range map[string]string{
		"proprietary": "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Sat Aug 19 01:15:15 UTC 2023\nGCC version:  gcc version 12.2.0\n",
		"open":        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder@U16-I3-B03-4-3)  Sat Aug 19 01:15:15 UTC 2023\n",
	} {
		t.Run(name, func(t *testing.T) {
			root, proc := t.TempDir(), t.TempDir()
			dir := filepath.Join(root, "usr/lib/x86_64-linux-gnu")
			layOutLibs(t, dir, []string{"libcuda.so.535.104.05", "libcuda.so.550.54.15"},
				map[string]string{"libcuda.so.1": "libcuda.so.535.104.05"})
			if err := os.MkdirAll(filepath.Join(proc, "driver/nvidia"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(proc, "driver/nvidia/version"), []byte(nvrm), 0o644); err != nil {
				t.Fatal(err)
			}
			d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root, Proc: proc})
			if err != nil {
				t.Fatal(err)
			}
			if d.Version != "550.54.15" {
				t.Errorf("version %s, want the kernel module's 550.54.15", d.Version)
			}
			if !hasMount(d.Mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", filepath.Join(dir, "libcuda.so.550.54.15")) {
				t.Errorf("the module's library is not mounted: %+v", d.Mounts)
			}
		})
	}
}

// A driver container's absolute links (libcuda.so.1 -> /usr/lib/...) name its own root, not
// the plugin's: they resolve inside the driver root.
func TestDiscoverResolvesAbsoluteLinksInsideTheRoot(t *testing.T) {
	local := t.TempDir()
	dir := filepath.Join(local, "usr/lib/x86_64-linux-gnu")
	layOutLibs(t, dir, []string{"libcuda.so.550.54.15"},
		map[string]string{"libcuda.so.1": "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"})
	bin := filepath.Join(local, "usr/bin")
	if err := os.MkdirAll(filepath.Join(local, "opt/nvidia"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(local, "opt/nvidia/nvidia-smi"), nil, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/opt/nvidia/nvidia-smi", filepath.Join(bin, "nvidia-smi")); err != nil {
		t.Fatal(err)
	}
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: "/run/nvidia/driver", Local: local, Proc: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if !hasMount(d.Mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15") {
		t.Errorf("absolute libcuda.so.1 link inside the root dropped: %+v", d.Mounts)
	}
	if !hasMount(d.Mounts, "/usr/bin/nvidia-smi", "/run/nvidia/driver/opt/nvidia/nvidia-smi") {
		t.Errorf("absolute nvidia-smi link inside the root dropped: %+v", d.Mounts)
	}
}

// A RHEL root's libraries in /usr/lib64 are no default loader directory of a Debian-based CUDA
// image: they come again in ImageLibDir, on NVIDIA images' LD_LIBRARY_PATH. Libraries of the
// same version in another directory (a 32-bit one in ld.so.cache; here the root's top, which the
// locator searches too) stay out of it: they may be of another architecture.
func TestDiscoverBindsLibrariesWhereNVIDIAImagesLook(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "usr/lib64")
	layOutLibs(t, dir, []string{"libcuda.so.550.54.15", "libnvidia-ml.so.550.54.15"},
		map[string]string{"libcuda.so.1": "libcuda.so.550.54.15", "libnvidia-ml.so.1": "libnvidia-ml.so.550.54.15"})
	layOutLibs(t, root, []string{"libnvidia-ml.so.550.54.15"}, nil)
	d, err := Discover(ktesting.NewLogger(t, ktesting.DefaultConfig), Root{Host: root, Proc: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	for _, lib := range []string{"libcuda.so.1", "libnvidia-ml.so.1", "libcuda.so.550.54.15"} {
		host := filepath.Join(dir, strings.Replace(lib, ".so.1", ".so.550.54.15", 1))
		for _, at := range []string{"/usr/lib64/" + lib, ImageLibDir + "/" + lib} {
			if !hasMount(d.Mounts, at, host) {
				t.Errorf("no %s bound to %s: %+v", at, host, d.Mounts)
			}
		}
	}
	if !hasMount(d.Mounts, "/libnvidia-ml.so.550.54.15", filepath.Join(root, "libnvidia-ml.so.550.54.15")) {
		t.Errorf("the other directory's library is not mounted at its own path: %+v", d.Mounts)
	}
	for _, m := range d.Mounts {
		if strings.HasPrefix(m.ContainerPath, ImageLibDir) && !strings.HasPrefix(m.HostPath, dir) {
			t.Errorf("%s comes from %s, not from libcuda's directory", m.ContainerPath, m.HostPath)
		}
	}
}
