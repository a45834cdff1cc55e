// Package driverroot finds what NVIDIA's container toolkit gives a GPU container from a driver
// installation (driver libraries with their soname links, the driver's tools, its daemons' IPC
// sockets) and turns it into read-only CDI bind mounts at the paths a CUDA image expects.
//
// It searches with the toolkit's own locators (pkg/lookup). The toolkit's CDI generator
// (pkg/nvcdi) is not used: it needs go-nvml, hence cgo, and the plugin builds without it; and
// its edits carry hooks (nvidia-cdi-hook create-symlinks, update-ldcache) whose binary need not
// exist on a node fgpu runs on. Instead each soname link (libcuda.so.1) is given as a bind of
// the library it resolves to, and no ldcache update is made: the libraries land in the
// directories the dynamic loader searches by default on the distributions CUDA images are
// built from (/usr/lib/x86_64-linux-gnu, /usr/lib64).
package driverroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/NVIDIA/nvidia-container-toolkit/pkg/lookup"
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
}

// Driver is what a claim's containers receive from the driver root.
type Driver struct {
	Version string
	Mounts  []cdi.Mount
}

// Binaries are the toolkit's driver tools but the MPS ones: fgpu runs each tenant's MPS server,
// so a container has no use for its own.
var Binaries = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-imex", "nvidia-imex-ctl"}

// Sockets are the driver daemons' IPC sockets the toolkit mounts, under /run or /var/run.
// The host's default MPS pipe directory (/tmp/nvidia-mps), which it mounts too, is left out:
// tenants must reach only their own domain's MPS server.
var Sockets = []string{"nvidia-persistenced/socket", "nvidia-fabricmanager/socket"}

var (
	binPaths = []string{"/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"}
	// The toolkit's mount options: read-only for files, writable (noexec) for sockets.
	fileOptions   = []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}
	socketOptions = []string{"nosuid", "nodev", "rbind", "rprivate", "noexec"}
)

// Discover finds the driver under r. The version is the suffix of libcuda.so.<version> (or
// libnvidia-ml.so.<version>), as the toolkit infers it without NVML.
func Discover(logger klog.Logger, r Root) (Driver, error) {
	if r.Host == "" {
		return Driver{}, errors.New("no driver root")
	}
	if r.Local == "" {
		r.Local = r.Host
	}
	local, err := filepath.EvalSymlinks(r.Local)
	if err != nil {
		return Driver{}, fmt.Errorf("driver root %s: %w", r.Host, err)
	}
	d := discovery{root: r, local: local, log: logAdapter{logger}}
	libs, err := d.libraries()
	if err != nil {
		return Driver{}, err
	}
	d.driver.Mounts = slices.Concat(libs, d.binaries(), d.sockets())
	return d.driver, nil
}

type discovery struct {
	root   Root
	local  string
	log    logAdapter
	driver Driver
}

func (d *discovery) libraries() ([]cdi.Mount, error) {
	libs := lookup.NewLibraryLocator(lookup.WithRoot(d.local), lookup.WithLogger(d.log))
	var found []string
	for _, lib := range []string{"libcuda.so.", "libnvidia-ml.so."} {
		if paths, err := libs.Locate(lib + "*.*"); err == nil && len(paths) > 0 {
			found = paths
			d.driver.Version = strings.TrimPrefix(filepath.Base(paths[0]), lib)
			break
		}
	}
	if d.driver.Version == "" {
		return nil, fmt.Errorf("no NVIDIA driver under driver root %s: found neither libcuda.so.<version> nor libnvidia-ml.so.<version> in its library directories or ld.so.cache", d.root.Host)
	}
	// Every library of this version in the directories that hold the driver's.
	var dirs []string
	for _, p := range found {
		dirs = append(dirs, filepath.Dir(p))
	}
	if all, err := libs.Locate("lib*.so." + d.driver.Version); err == nil {
		for _, p := range all {
			dirs = append(dirs, filepath.Dir(p))
		}
	}
	slices.Sort(dirs)
	dirs = slices.Compact(dirs)

	var mounts []cdi.Mount
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("driver libraries in %s: %w", d.root.Host, err)
		}
		for _, e := range entries {
			p := filepath.Join(dir, e.Name())
			target, err := filepath.EvalSymlinks(p)
			if err != nil || !strings.HasSuffix(filepath.Base(target), ".so."+d.driver.Version) {
				continue
			}
			// A soname or development link (libcuda.so.1 -> libcuda.so.<version>) becomes a bind
			// of the library at the link's path: CDI mounts cannot make symlinks.
			if m, ok := d.mount(target, p, fileOptions); ok {
				mounts = append(mounts, m)
			}
		}
	}
	return mounts, nil
}

func (d *discovery) binaries() []cdi.Mount {
	loc := lookup.NewFileLocator(lookup.WithRoot(d.local), lookup.WithLogger(d.log), lookup.WithSearchPaths(binPaths...), lookup.WithCount(1))
	var mounts []cdi.Mount
	for _, name := range Binaries {
		paths, err := loc.Locate(name)
		if err != nil || len(paths) == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(paths[0])
		if err != nil {
			continue
		}
		if info, err := os.Stat(target); err != nil || info.Mode()&0o111 == 0 {
			continue
		}
		if m, ok := d.mount(target, paths[0], fileOptions); ok {
			mounts = append(mounts, m)
		}
	}
	return mounts
}

func (d *discovery) sockets() []cdi.Mount {
	loc := lookup.NewFileLocator(lookup.WithRoot(d.local), lookup.WithLogger(d.log), lookup.WithSearchPaths("/run", "/var/run"), lookup.WithCount(1))
	var mounts []cdi.Mount
	for _, name := range Sockets {
		paths, err := loc.Locate(name)
		if err != nil || len(paths) == 0 {
			continue
		}
		target, err := filepath.EvalSymlinks(paths[0])
		if err != nil {
			continue
		}
		if m, ok := d.mount(target, paths[0], socketOptions); ok {
			mounts = append(mounts, m)
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
	dir, err := filepath.EvalSymlinks(filepath.Dir(at))
	if err != nil {
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
