package mps

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// mountShm mounts a tmpfs of size bytes on dir, once: a mount already there (this plugin's
// before a restart, propagated to the host) is kept, never stacked.
func mountShm(dir string, size int64) error {
	mounted, err := isMountPoint(dir)
	if err != nil || mounted {
		return err
	}
	// 1777 as /dev/shm: clients of any UID create their segments there.
	opts := fmt.Sprintf("size=%d,mode=1777", size)
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount the MPS shm tmpfs on %s: %w", dir, err)
	}
	return nil
}

// unmountShm unmounts dir's tmpfs if it has one. Lazily: the last client may still be
// leaving; the memory goes with it.
func unmountShm(dir string) error {
	mounted, err := isMountPoint(dir)
	if err != nil || !mounted {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("unmount the MPS shm tmpfs on %s: %w", dir, err)
	}
	return nil
}

// isMountPoint says whether dir is a mount point in this mount namespace. mountinfo names
// mount points by their real paths (a container's /var/run may be a link to /run).
func isMountPoint(dir string) (bool, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && unescapeMountPath(fields[4]) == dir {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescapeMountPath undoes mountinfo's octal escapes of space, tab, newline and backslash.
func unescapeMountPath(p string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(p)
}
