// Package driverroot finds what NVIDIA's container toolkit gives a GPU container from a driver
// installation (driver libraries with their soname links, the driver's tools, its daemons' IPC
// sockets) and turns it into read-only CDI bind mounts at the paths a CUDA image expects.
//
// It searches with the toolkit's own locators (pkg/lookup). The toolkit's CDI generator
// (pkg/nvcdi) is not used: it needs go-nvml, hence cgo, and the plugin builds without it; and
// its edits carry hooks (nvidia-cdi-hook create-symlinks, update-ldcache) whose binary need not
// exist on a node fgpu runs on. Instead each soname link (libcuda.so.1) is given as a bind of
// the library it resolves to, and no ldcache update is made. The libraries land at their paths
// under the root, which the dynamic loader searches by default only in an image of the root's
// family (/usr/lib/x86_64-linux-gnu for Debian and Ubuntu, /usr/lib64 for RHEL), and again in
// ImageLibDir, which NVIDIA's CUDA images put on LD_LIBRARY_PATH. An image of the other family
// without that variable does not find the driver.
package driverroot

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
	securejoin "github.com/cyphar/filepath-securejoin"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/cdi"
)

// Root is a driver installation: "/" for a driver installed on the host, or e.g.
// /run/nvidia/driver for NVIDIA's GPU Operator driver container.
type Root struct {
	// Host is the root's path on the host: CDI mounts name host paths.
	Host string
	// Local is where this process sees Host (a container mounts it elsewhere); default Host.
	Local string
	// Proc is where this process sees the kernel's /proc, default /proc. The loaded driver
	// module's version there (driver/nvidia/version) is the kernel's, the same in every PID
	// namespace, so a container's own /proc serves.
	Proc string
}

// Driver is what a claim's containers receive from the driver root.
type Driver struct {
	Version string
	Mounts  []cdi.Mount
	// NVML is where this process sees the root's libnvidia-ml.so.1 (empty: none), so that the
	// plugin's NVML backend loads the driver its containers get, not one of its own image.
	NVML string
}

// Binaries are the toolkit's driver tools but the MPS ones: fgpu runs each tenant's MPS server,
// so a container has no use for its own.
var Binaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-imex", "nvidia-imex-ctl"}

// Sockets are the driver daemons' IPC sockets the toolkit mounts, under /run or /var/run.
// The host's default MPS pipe directory (/tmp/nvidia-mps), which it mounts too, is left out:
// tenants must reach only their own domain's MPS server.
var Sockets = []string{"nvidia-persistenced/socket", "nvidia-fabricmanager/socket"}

// ImageLibDir is where every driver library is bound a second time: NVIDIA's CUDA images (and
// PyTorch's, built on them) have it on LD_LIBRARY_PATH, whatever their distribution.
const ImageLibDir = "/usr/local/nvidia/lib64"

var (
	binPaths = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"}
	// The toolkit's mount options: read-only for files, writable (noexec) for sockets.
	fileOptions   = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	socketOptions = []string{"nosuid", "nodev", "rbind", "rprivate", "noexec"}
)

// Discover finds the driver under r. Its version is the loaded kernel module's when the root
// holds that version's libcuda.so (or libnvidia-ml.so), else the one libcuda.so.1 links to,
// else the highest the root holds. Links under the root resolve inside it, as in a container
// whose / is the root: an absolute libcuda.so.1 -> /usr/lib/... names the root's /usr/lib.
func Discover(logger klog.Logger, r Root) (Driver, error) {
	if r.Host == "" {
		return Driver{}, errors.New("no driver root")
	}
	if r.Local == "" {
		r.Local = r.Host
	}
	if r.Proc == "" {
		r.Proc = "/proc"
	}
	local, err := filepath.EvalSymlinks(r.Local)
	if err != nil {
		return Driver{}, fmt.Errorf("driver root %s: %w", r.Host, err)
	}
	d := discovery{root: r, local: local, logger: logger, log: logAdapter{logger}}
	libs, err := d.libraries()
	if err != nil {
		return Driver{}, err
	}
	if !slices.ContainsFunc(libs, func(m cdi.Mount) bool { return filepath.Base(m.ContainerPath) == "libcuda.so.1" }) {
		logger.Info("Warning: no libcuda.so.1 for containers: CUDA programs in them will not find the driver", "driverRoot", r.Host, "version", d.driver.Version)
	}
	d.driver.Mounts = slices.Concat(libs, d.binaries(), d.sockets())
	return d.driver, nil
}

type discovery struct {
	root   Root
	local  string
	logger klog.Logger
	log    logAdapter
	driver Driver
}

// resolve follows the links in p, a path under the root, as if the root were /: never out of
// it. It reports whether what p names exists.
func (d *discovery) resolve(p string) (string, bool) {
	rel, ok := d.relative(p)
	if !ok {
		return "", false
	}
	target, err := securejoin.SecureJoin(d.local, rel)
	if err != nil {
		return "", false
	}
	if _, err := os.Lstat(target); err != nil {
		return "", false
	}
	return target, true
}

func (d *discovery) libraries() ([]cdi.Mount, error) {
	libs := lookup.NewLibraryLocator(lookup.WithRoot(d.local), lookup.WithLogger(d.log))
	var found []string
	var prefix string
	for _, lib := range []string{"libcuda.so.", "libnvidia-ml.so."} {
		if paths, err := libs.Locate(lib + "*.*"); err == nil && len(paths) > 0 {
			// The locator resolves links outside the root; only what lies in it is the driver's.
			for _, p := range paths {
				if _, ok := d.relative(p); ok {
					found = append(found, p)
				}
			}
		}
		if len(found) > 0 {
			prefix = lib
			break
		}
	}
	if len(found) == 0 {
		return nil, fmt.Errorf("no NVIDIA driver under driver root %s: found neither libcuda.so.<version> nor libnvidia-ml.so.<version> in its library directories or ld.so.cache", d.root.Host)
	}
	// The directories that hold the driver's libraries.
	var dirs []string
	for _, p := range found {
		dirs = append(dirs, filepath.Dir(p))
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)
	d.driver.Version = d.version(prefix, found, dirs)
	if all, err := libs.Locate("lib*.so." + d.driver.Version); err == nil {
		for _, p := range all {
			if _, ok := d.relative(p); ok {
				dirs = append(dirs, filepath.Dir(p))
			}
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)

	var mounts []cdi.Mount
	for _, dir := range dirs {
		primary := slices.ContainsFunc(found, func(p string) bool { return filepath.Dir(p) == dir })
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("driver libraries in %s: %w", d.root.Host, err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			target, ok := d.resolve(p)
			if !ok || !strings.HasSuffix(filepath.Base(target), ".so."+d.driver.Version) {
				continue
			}
			if info, err := os.Stat(target); err != nil || !info.Mode().IsRegular() {
				continue
			}
			// A soname or development link (libcuda.so.1 -> libcuda.so.<version>) becomes a bind
			// of the library at the link's path: CDI mounts cannot make symlinks.
			m, ok := d.mount(target, p, fileOptions)
			if !ok {
				continue
			}
			mounts = append(mounts, m)
			if primary && filepath.Base(p) == "libnvidia-ml.so.1" {
				d.driver.NVML = target
			}
			// Again where NVIDIA's images look (LD_LIBRARY_PATH): a RHEL root's /usr/lib64 is
			// no default loader directory of a Debian-based image, nor the other way round.
			// Only the directory of libcuda's architecture: a 32-bit library there would break.
			if primary {
				m.ContainerPath = filepath.Join(ImageLibDir, filepath.Base(p))
				if !slices.ContainsFunc(mounts, func(o cdi.Mount) bool { return o.ContainerPath == m.ContainerPath }) {
					mounts = append(mounts, m)
				}
			}
		}
	}
	return mounts, nil
}

// version picks the driver's version among the libraries found (prefix<version>): the loaded
// kernel module's, which user space must match; else the one the soname link (libcuda.so.1),
// which the loader opens, names; else the highest. An upgrade may leave an older library next
// to the current one, so the first one found is no answer.
func (d *discovery) version(prefix string, found, dirs []string) string {
	var versions []string
	for _, p := range found {
		versions = append(versions, strings.TrimPrefix(filepath.Base(p), prefix))
	}
	module := moduleVersion(filepath.Join(d.root.Proc, "driver/nvidia/version"))
	if module != "" && slices.Contains(versions, module) {
		return module
	}
	chosen := ""
	for _, dir := range dirs {
		if target, ok := d.resolve(filepath.Join(dir, prefix+"1")); ok {
			if v, ok := strings.CutPrefix(filepath.Base(target), prefix); ok && slices.Contains(versions, v) {
				chosen = v
				break
			}
		}
	}
	if chosen == "" {
		chosen = slices.MaxFunc(versions, compareVersions)
	}
	if module != "" {
		d.logger.Info("Warning: the driver root holds no user-space driver of the loaded kernel module's version: CUDA in containers may fail with a driver/library version mismatch until the node runs the matching module", "driverRoot", d.root.Host, "kernelModule", module, "version", chosen)
	}
	return chosen
}

// moduleVersion reads the loaded NVIDIA kernel module's version from /proc/driver/nvidia/version
// ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  ..."); "" when there is none.
func moduleVersion(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	line, _, _ := strings.Cut(string(b), "\n")
	if !strings.HasPrefix(line, "NVRM version:") {
		return ""
	}
	for _, f := range strings.Fields(line) {
		if isVersion(f) {
			return f
		}
	}
	return ""
}

// isVersion reports whether s is a dotted version of at least two numbers (550.54.15).
func isVersion(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) < 2 {
		return false
	}
	for _, p := range parts {
		if _, err := strconv.Atoi(p); err != nil {
			return false
		}
	}
	return true
}

// compareVersions orders dotted versions by their numbers (535.104.05 < 550.54.15), and
// anything else after them, by text.
func compareVersions(a, b string) int {
	if isVersion(a) != isVersion(b) {
		if isVersion(a) {
			return 1
		}
		return -1
	}
	if !isVersion(a) {
		return strings.Compare(a, b)
	}
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := range min(len(pa), len(pb)) {
		x, _ := strconv.Atoi(pa[i])
		y, _ := strconv.Atoi(pb[i])
		if c := cmp.Compare(x, y); c != 0 {
			return c
		}
	}
	return cmp.Compare(len(pa), len(pb))
}

func (d *discovery) binaries() []cdi.Mount {
	var mounts []cdi.Mount
	for _, name := range Binaries {
		for _, dir := range binPaths {
			p := filepath.Join(d.local, dir, name)
			target, ok := d.resolve(p)
			if !ok {
				continue
			}
			if info, err := os.Stat(target); err != nil || !info.Mode().IsRegular() || info.Mode()&0o111 == 0 {
				continue
			}
			if m, ok := d.mount(target, p, fileOptions); ok {
				mounts = append(mounts, m)
			}
			break
		}
	}
	return mounts
}

func (d *discovery) sockets() []cdi.Mount {
	var mounts []cdi.Mount
	for _, name := range Sockets {
		for _, dir := range []string{"/run", "/var/run"} {
			p := filepath.Join(d.local, dir, name)
			target, ok := d.resolve(p)
			if !ok {
				continue
			}
			if m, ok := d.mount(target, p, socketOptions); ok {
				mounts = append(mounts, m)
			}
			break
		}
	}
	return mounts
}

// mount binds the file at local path target to the container path of local path at: both
// relative to the root, so the container sees the host's /run/nvidia/driver/usr/bin/nvidia-smi
// at /usr/bin/nvidia-smi, as the toolkit does. A file that resolves outside the root is left
// out: it is not the driver's.
func (d *discovery) mount(target, at string, options []string) (cdi.Mount, bool) {
	relTarget, ok := d.relative(target)
	if !ok {
		d.log.Warningf("Leaving out %s: it resolves to %s, outside driver root %s", at, target, d.root.Host)
		return cdi.Mount{}, false
	}
	// The link's own directory may be a symlink (lib -> usr/lib); the container path is the
	// canonical one, where the loader looks.
	dir, ok := d.resolve(filepath.Dir(at))
	if !ok {
		return cdi.Mount{}, false
	}
	relAt, ok := d.relative(filepath.Join(dir, filepath.Base(at)))
	if !ok {
		return cdi.Mount{}, false
	}
	return cdi.Mount{
		HostPath:      filepath.Join(d.root.Host, relTarget),
		ContainerPath: filepath.Join("/", relAt),
		Options:       options,
	}, true
}

func (d *discovery) relative(p string) (string, bool) {
	rel, err := filepath.Rel(d.local, p)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

// logAdapter gives the toolkit's locators the caller's logger: their detail at high verbosity.
type logAdapter struct{ klog.Logger }

func (l logAdapter) Debugf(f string, a ...any)   { l.V(6).Info(fmt.Sprintf(f, a...)) }
func (l logAdapter) Tracef(f string, a ...any)   { l.V(7).Info(fmt.Sprintf(f, a...)) }
func (l logAdapter) Infof(f string, a ...any)    { l.V(4).Info(fmt.Sprintf(f, a...)) }
func (l logAdapter) Warningf(f string, a ...any) { l.V(2).Info("Warning: " + fmt.Sprintf(f, a...)) }
func (l logAdapter) Errorf(f string, a ...any)   { l.Error(nil, fmt.Sprintf(f, a...)) }
