package fake

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// DriverRootMarker is the file that marks a directory as a fake driver LayOutDriverRoot laid
// out: it writes only into an empty directory or one that carries it, never over a real driver.
const DriverRootMarker = ".fgpu-fake-driver"

// DriverRoot is what LayOutDriverRoot created, as paths relative to the root: what a
// container of a claim must see at those same paths.
type DriverRoot struct {
	Version string
	// Libraries are the versioned driver libraries (libcuda.so.<version>, ...).
	Libraries []string
	// Links are the soname and development links to them (libcuda.so.1, libcuda.so), by
	// link path, each with the library it resolves to.
	Links map[string]string
	// Binaries are the driver's tools (usr/bin/nvidia-smi, ...).
	Binaries []string
	// Sockets are the driver daemons' IPC sockets (run/nvidia-persistenced/socket).
	Sockets []string
}

// fakeLibDir is where Debian and Ubuntu (and NVIDIA's driver container) keep driver libraries.
const fakeLibDir = "usr/lib/x86_64-linux-gnu"

// LayOutDriverRoot writes a fake NVIDIA driver installation under root, as a host or a GPU
// Operator driver container has it: versioned libraries with their soname links, tools and the
// persistence daemon's socket path. The files only need to exist for containers to see them.
// It is idempotent, so a restarted plugin can run it again. It refuses a directory that holds
// anything but its own layout, and follows no symlink inside the root.
func LayOutDriverRoot(root string) (DriverRoot, error) {
	if err := claimDriverRoot(root); err != nil {
		return DriverRoot{}, err
	}
	v := driverVersion
	d := DriverRoot{Version: v, Links: map[string]string{}}
	pointsTo := map[string]string{} // link -> what it names, which may be another link
	for _, lib := range []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libcudadebugger"} {
		file := filepath.Join(fakeLibDir, lib+".so."+v)
		d.Libraries = append(d.Libraries, file)
		d.Links[filepath.Join(fakeLibDir, lib+".so.1")] = file
		pointsTo[filepath.Join(fakeLibDir, lib+".so.1")] = file
	}
	// A chain, as the driver installs it: libcuda.so -> libcuda.so.1 -> libcuda.so.<version>.
	d.Links[filepath.Join(fakeLibDir, "libcuda.so")] = filepath.Join(fakeLibDir, "libcuda.so."+v)
	pointsTo[filepath.Join(fakeLibDir, "libcuda.so")] = filepath.Join(fakeLibDir, "libcuda.so.1")
	d.Binaries = []string{"usr/bin/nvidia-smi", "usr/bin/nvidia-debugdump"}
	d.Sockets = []string{"run/nvidia-persistenced/socket"}

	write := func(rel string, mode os.FileMode, content string) error {
		if err := mkdirsIn(root, filepath.Dir(rel)); err != nil {
			return err
		}
		return writeNew(filepath.Join(root, rel), mode, content)
	}
	for _, lib := range d.Libraries {
		if err := write(lib, 0o644, "fake NVIDIA driver library "+v+"\n"); err != nil {
			return d, fmt.Errorf("fake driver root: %w", err)
		}
	}
	for _, bin := range d.Binaries {
		if err := write(bin, 0o755, "#!/bin/sh\necho 'fake "+filepath.Base(bin)+" (driver "+v+")'\n"); err != nil {
			return d, fmt.Errorf("fake driver root: %w", err)
		}
	}
	// A regular file stands in for the socket: containers only need the path to exist.
	for _, s := range d.Sockets {
		if err := write(s, 0o666, ""); err != nil {
			return d, fmt.Errorf("fake driver root: %w", err)
		}
	}
	for link, target := range pointsTo {
		if err := mkdirsIn(root, filepath.Dir(link)); err != nil {
			return d, fmt.Errorf("fake driver root: %w", err)
		}
		p := filepath.Join(root, link)
		// Relative, as the driver's installer makes them, so they resolve under any root.
		rel, err := filepath.Rel(filepath.Dir(link), target)
		if err != nil {
			return d, err
		}
		if cur, err := os.Readlink(p); err == nil && cur == rel {
			continue
		}
		_ = os.Remove(p)
		if err := os.Symlink(rel, p); err != nil {
			return d, fmt.Errorf("fake driver root: %w", err)
		}
	}
	return d, nil
}

// claimDriverRoot makes root a directory of its own: created, or empty, or marked by an earlier
// layout; anything else may be a real driver and is refused.
func claimDriverRoot(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("fake driver root: %w", err)
	}
	marker := filepath.Join(root, DriverRootMarker)
	if info, err := os.Lstat(marker); err == nil && info.Mode().IsRegular() {
		return nil
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("fake driver root: %w", err)
	}
	if len(entries) > 0 && !earlierLayout(root) {
		return fmt.Errorf("fake driver root %s is not empty and has no %s marker: it may hold a real driver, so nothing is written there; give fake GPUs an empty directory of their own", root, DriverRootMarker)
	}
	return writeNew(marker, 0o644, "a fake NVIDIA driver laid out by fgpu's kubelet plugin for fake GPUs\n")
}

// earlierLayout reports whether root holds a layout of a plugin from before the marker: its
// nvidia-smi is the fake's shell script, which no real driver ships.
func earlierLayout(root string) bool {
	smi := filepath.Join(root, "usr/bin/nvidia-smi")
	if info, err := os.Lstat(smi); err != nil || !info.Mode().IsRegular() {
		return false
	}
	b, err := os.ReadFile(smi)
	return err == nil && strings.HasPrefix(string(b), "#!/bin/sh\necho 'fake nvidia-smi (driver ")
}

// mkdirsIn creates the directory rel under root, refusing a symlink on the way: a link in the
// root could lead the layout out of it.
func mkdirsIn(root, rel string) error {
	p := root
	for _, part := range strings.Split(filepath.Clean(rel), string(filepath.Separator)) {
		if part == "." || part == "" {
			continue
		}
		p = filepath.Join(p, part)
		info, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
		case err != nil:
			return err
		case !info.IsDir():
			return fmt.Errorf("%s is not a directory (a symlink is not followed)", p)
		}
	}
	return nil
}

// writeNew replaces the file at p by a new one, never writing through a symlink there.
func writeNew(p string, mode os.FileMode, content string) error {
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(content); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
