package mps

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The control view.
//
// Each daemon's pipe directory is mounted read-write into its tenants' containers, so a
// tenant can put anything there in place of the daemon's control socket: a symlink to
// another namespace's socket (whose key it can compute), or a socket of its own. The plugin
// runs nvidia-cuda-mps-control as root, and the binary follows whatever it finds. So every
// control command reaches its pipe directory through a view of Root that follows no
// symlink at all: a bind mount of Root with MS_NOSYMFOLLOW. The kernel refuses the symlink
// at the moment the command connects, so no check made before the command can be raced.
//
// The view is detached from every mount table as soon as it is opened and lives as long as
// the directory the Manager holds open: it propagates to no other mount namespace (the
// plugin's state directory is a Bidirectional mount shared with the host), needs no clean-up
// when the plugin exits, and the commands reach it through /proc/<pid>/fd/<fd>. The bind
// is not recursive: a command needs only the pipe and log directories, and a copy of each
// daemon's shm tmpfs would keep its memory after the daemon's stop unmounts it.

// OpenControlView opens the view of Root through which every control command reaches its
// daemon (see above); control commands are refused until it is open. It needs root and
// Linux 5.10 or later (MS_NOSYMFOLLOW). Idempotent.
func (m *Manager) OpenControlView() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.view != nil {
		return nil
	}
	if err := os.MkdirAll(m.Root, 0o755); err != nil {
		return fmt.Errorf("create MPS directory: %w", err)
	}
	view, err := openNoSymlinkView(m.Root)
	if err != nil {
		return fmt.Errorf("cannot make the view of the MPS directory %s that MPS control commands go through, which follows no symlink a tenant puts in its pipe directory: %w (it needs root and Linux 5.10 or later for MS_NOSYMFOLLOW)", m.Root, err)
	}
	m.view = view
	return nil
}

// openNoSymlinkView returns a directory open on a detached, private, non-recursive bind
// mount of root with MS_NOSYMFOLLOW.
func openNoSymlinkView(root string) (*os.File, error) {
	// The mount point is the plugin's own (its container's filesystem, not the state
	// directory) and exists only until the view is detached below.
	dir, err := os.MkdirTemp("", "fgpu-mps-view-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(dir)
	if err := unix.Mount(root, dir, "", unix.MS_BIND, ""); err != nil {
		return nil, fmt.Errorf("bind mount: %w", err)
	}
	detach := func() error { return unix.Unmount(dir, unix.MNT_DETACH) }
	// A bind of a shared mount joins its peer group: private before anything else, so that
	// nothing done to the view reaches the host and nothing mounted under root later
	// reaches the view.
	if err := unix.Mount("", dir, "", unix.MS_PRIVATE, ""); err != nil {
		return nil, errors.Join(fmt.Errorf("make the view private: %w", err), detach())
	}
	if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_NOSYMFOLLOW|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, errors.Join(fmt.Errorf("remount the view with nosymfollow: %w", err), detach())
	}
	view, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, errors.Join(err, detach())
	}
	if err := detach(); err != nil {
		return nil, errors.Join(fmt.Errorf("detach the view: %w", err), view.Close())
	}
	return view, nil
}

// controlDirs are the pipe and log directories of daemon key as its control commands see
// them: through the view. The daemon's control socket is checked to be a socket first,
// although the view is what closes the hole: a tenant can replace the socket between this
// check and the command, but the view never follows a symlink. The check names what is
// wrong instead of the control binary's "cannot find the daemon".
func (m *Manager) controlDirs(key string) (pipeDir, logDir string, err error) {
	m.mu.Lock()
	view := m.view
	m.mu.Unlock()
	if view == nil {
		return "", "", fmt.Errorf("refusing to run MPS control commands for daemon %s: the view of %s that follows no symlink is not open (Manager.OpenControlView)", key, m.Root)
	}
	dir := filepath.Join(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), view.Fd()), key)
	pipeDir, logDir = filepath.Join(dir, "pipe"), filepath.Join(dir, "log")
	fi, err := os.Lstat(filepath.Join(pipeDir, controlSocket))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", "", fmt.Errorf("MPS daemon %s has no control socket in %s: it is not running", key, m.PipeDir(key))
	case err != nil:
		return "", "", fmt.Errorf("MPS daemon %s: %w", key, err)
	case fi.Mode().Type() != fs.ModeSocket:
		return "", "", fmt.Errorf("refusing to run MPS control commands for daemon %s: %s is a %s, not the daemon's socket; its pipe directory is mounted read-write into its isolation domain's containers, so a tenant of that domain replaced it. The daemon is treated as not answering: the plugin replaces it and moves that domain's pods",
			key, filepath.Join(m.PipeDir(key), controlSocket), fileKind(fi.Mode()))
	}
	return pipeDir, logDir, nil
}

func fileKind(mode fs.FileMode) string {
	switch mode.Type() {
	case fs.ModeSymlink:
		return "symlink"
	case fs.ModeDir:
		return "directory"
	case 0:
		return "regular file"
	default:
		return "special file (" + mode.Type().String() + ")"
	}
}
