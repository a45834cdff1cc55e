package main

// A tenant is a process started the way a container runtime would start a claim's container:
// in its own PID, mount, IPC and UTS namespaces, on a root of its own that holds the host's
// read-only system directories and exactly the device nodes, mounts and environment of the
// claim's CDI devices (applied by the CDI library, as containerd does), and nothing of the
// host's driver, of fgpu's state directory or of the other tenants.

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

// tenantSpecEnv carries the tenant's prepared spec from the parent to the process that runs
// inside the new namespaces.
const tenantSpecEnv = "GPUCHECK_TENANT_SPEC"

// imageEnv is what NVIDIA's CUDA images set: the driver is found only where the CDI spec
// puts it (/usr/local/nvidia), never on a host library path.
var imageEnv = []string{
	"PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64",
	"HOME=/root",
}

// tenantSpec is what the process in the new namespaces needs.
type tenantSpec struct {
	OCI *oci.Spec
	// System are host directories that form the tenant's image: overlays of them, so that the
	// host's copies never change.
	System []string
	// Binds are "SOURCE:DEST" read-only binds of the check's own files into the image.
	Binds []string
	// Hide are directories of the image covered with an empty tmpfs (the host's driver).
	Hide []string
	Args []string
	// Root is the (empty) directory the tenant's root is mounted on, in its own mount
	// namespace; the parent removes it once the tenant exited.
	Root string
}

// tenant runs ARGS as a container of the claims whose CDI devices are named, and returns its
// exit status.
func tenant(args []string) error {
	fs := flag.NewFlagSet("tenant", flag.ContinueOnError)
	cdiDir := fs.String("cdi-dir", "", "directory of the CDI specs the plugin wrote")
	devices := fs.String("devices", "", "comma-separated CDI device IDs of the tenant's claims")
	system := fs.String("system", "/usr,/lib,/lib64,/bin,/sbin,/etc,/opt,/root", "host directories that form the tenant's image (read-only)")
	hide := fs.String("hide", "/usr/local/nvidia", "directories of the image covered with an empty tmpfs")
	var extraEnv, binds multiFlag
	fs.Var(&extraEnv, "env", "KEY=VALUE the image sets (repeatable)")
	fs.Var(&binds, "bind", "SOURCE:DEST[:rw], a file or directory of the check bound into the image, read-only unless :rw (repeatable)")
	hostPID := fs.Bool("host-pid", false, "stay in the host's PID namespace, as a pod with hostPID (a fake-GPU workload reports its use under its node PID)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cdiDir == "" || *devices == "" || fs.NArg() == 0 {
		return errors.New("usage: gpucheck tenant --cdi-dir DIR --devices ID[,ID] [--env K=V] -- COMMAND [ARG...]")
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(*cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	spec := &oci.Spec{Process: &oci.Process{Env: append(slices.Clone(imageEnv), extraEnv...)}, Linux: &oci.Linux{}}
	if unresolved, err := cache.InjectDevices(spec, strings.Split(*devices, ",")...); err != nil {
		return fmt.Errorf("apply the CDI devices (unresolved %v): %w", unresolved, err)
	}
	// Made and removed here: the tenant's mounts on it go with its mount namespace, the
	// directory would stay.
	root, err := os.MkdirTemp("", "gpucheck-tenant-")
	if err != nil {
		return err
	}
	defer os.Remove(root)
	ts := tenantSpec{OCI: spec, System: strings.Split(*system, ","), Hide: splitNonEmpty(*hide), Binds: binds, Args: fs.Args(), Root: root}
	raw, err := json.Marshal(ts)
	if err != nil {
		return err
	}
	cmd := exec.Command("/proc/self/exe", "tenant-init")
	cmd.Env = []string{tenantSpecEnv + "=" + string(raw)}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	flags := uintptr(syscall.CLONE_NEWNS | syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS)
	if !*hostPID {
		flags |= syscall.CLONE_NEWPID
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	return cmd.Run()
}

// tenantInit runs as PID 1 of the tenant's namespaces: it builds the root and execs the
// command. It never returns on success.
func tenantInit() error {
	var ts tenantSpec
	if err := json.Unmarshal([]byte(os.Getenv(tenantSpecEnv)), &ts); err != nil {
		return fmt.Errorf("read the tenant spec: %w", err)
	}
	unix.Umask(0)
	if err := unix.Sethostname([]byte("tenant")); err != nil {
		return err
	}
	// Nothing mounted below may reach the host's mount table.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	root := ts.Root
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "mode=755"); err != nil {
		return fmt.Errorf("tenant root: %w", err)
	}
	for _, dir := range ts.System {
		if err := bindSystem(root, dir); err != nil {
			return err
		}
	}
	for _, m := range []struct{ dir, fstype, opts string }{
		{"/proc", "proc", ""}, {"/dev", "tmpfs", "mode=755"}, {"/dev/shm", "tmpfs", "mode=1777"},
		{"/tmp", "tmpfs", "mode=1777"}, {"/run", "tmpfs", "mode=755"},
	} {
		target := filepath.Join(root, m.dir)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.fstype, target, m.fstype, unix.MS_NOSUID, m.opts); err != nil {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindFile(filepath.Join("/dev", d), filepath.Join(root, "dev", d), false); err != nil {
			return err
		}
	}
	for _, dir := range ts.Hide {
		target := filepath.Join(root, dir)
		if _, err := os.Stat(target); err != nil {
			continue
		}
		if err := unix.Mount("tmpfs", target, "tmpfs", 0, "mode=755"); err != nil {
			return fmt.Errorf("hide %s: %w", dir, err)
		}
	}
	for _, b := range ts.Binds {
		src, dst, ok := strings.Cut(b, ":")
		if !ok {
			return fmt.Errorf("--bind %q: want SOURCE:DEST[:rw]", b)
		}
		dst, rw := strings.CutSuffix(dst, ":rw")
		if err := bindFile(src, filepath.Join(root, dst), !rw); err != nil {
			return err
		}
	}
	for _, d := range ts.OCI.Linux.Devices {
		if err := makeDevice(root, d); err != nil {
			return err
		}
	}
	for _, m := range ts.OCI.Mounts {
		if err := bindFile(m.Source, filepath.Join(root, m.Destination), slices.Contains(m.Options, "ro")); err != nil {
			return fmt.Errorf("CDI mount %s -> %s: %w", m.Source, m.Destination, err)
		}
	}
	if err := pivot(root); err != nil {
		return err
	}
	path, err := lookPath(ts.Args[0], ts.OCI.Process.Env)
	if err != nil {
		return err
	}
	return unix.Exec(path, ts.Args, ts.OCI.Process.Env)
}

// bindSystem lays a host system directory into the tenant's root as an image layer: an
// overlay whose writes stay in the tenant's tmpfs (so CDI mount points can be created in it,
// as in a container's writable layer), or the link it is on a merged-/usr system.
func bindSystem(root, dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	target := filepath.Join(root, dir)
	if fi.Mode()&os.ModeSymlink != 0 {
		link, err := os.Readlink(dir)
		if err != nil {
			return err
		}
		return os.Symlink(link, target)
	}
	if !fi.IsDir() {
		return bindFile(dir, target, true)
	}
	upper, work := filepath.Join(root, ".layers", dir, "upper"), filepath.Join(root, ".layers", dir, "work")
	for _, d := range []string{target, upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", dir, upper, work)
	if err := unix.Mount("overlay", target, "overlay", 0, opts); err != nil {
		return fmt.Errorf("image layer %s: %w", dir, err)
	}
	return nil
}

// bindFile bind-mounts source (a file or a directory) at target, creating target.
func bindFile(source, target string, readOnly bool) error {
	fi, err := os.Stat(source)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
	} else {
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			return err
		}
		f, err := os.OpenFile(target, os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		f.Close()
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind %s: %w", source, err)
	}
	if readOnly {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("make %s read-only: %w", target, err)
		}
	}
	return nil
}

func makeDevice(root string, d oci.LinuxDevice) error {
	target := filepath.Join(root, d.Path)
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	mode := uint32(unix.S_IFCHR)
	if d.Type == "b" {
		mode = unix.S_IFBLK
	}
	if err := unix.Mknod(target, mode|0o666, int(unix.Mkdev(uint32(d.Major), uint32(d.Minor)))); err != nil {
		return fmt.Errorf("device node %s: %w", d.Path, err)
	}
	return nil
}

func pivot(root string) error {
	old := filepath.Join(root, ".old-root")
	if err := os.Mkdir(old, 0o700); err != nil {
		return err
	}
	if err := unix.PivotRoot(root, old); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := unix.Unmount("/.old-root", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach the host root: %w", err)
	}
	return os.Remove("/.old-root")
}

// lookPath finds a command on the tenant's PATH (not the host's).
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	for _, kv := range env {
		if p, ok := strings.CutPrefix(kv, "PATH="); ok {
			for _, dir := range filepath.SplitList(p) {
				if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
					return filepath.Join(dir, name), nil
				}
			}
		}
	}
	return "", fmt.Errorf("%s: not found on the tenant's PATH", name)
}

func splitNonEmpty(s string) []string {
	var out []string
	for _, f := range strings.Split(s, ",") {
		if f != "" {
			out = append(out, f)
		}
	}
	return out
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
