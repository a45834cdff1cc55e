package fake

import (
	"fmt"
	"os"
	"path/filepath"
)

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
// It is idempotent, so a restarted plugin can run it again.
func LayOutDriverRoot(root string) (DriverRoot, error) {
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
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(content), mode)
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
