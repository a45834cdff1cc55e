package mps

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Whose answer.
//
// The view stops a tenant from pointing the plugin at another domain's socket, but the
// tenant can still put a socket of its own in its pipe directory and answer what it likes.
// That only hurts its own domain, except where an answer feeds a node-wide decision: the
// server PIDs that are never counted as foreign processes (ServerPIDs). There the plugin
// asks the kernel who listens on the socket (SO_PEERCRED): a process in the plugin's own
// PID namespace, as the daemons it starts are (a pod with hostPID, or its own detached
// child), and not one in a container's, as a tenant's is. The answer is then checked
// against that daemon: a server is a child of its control daemon (the stand-in serves as
// its own server). The socket may be swapped between the two connections, but whatever
// answers the command can then only name processes of the daemon that was checked.

// daemonPID is the PID of the process listening on daemon key's control socket, in the
// plugin's PID namespace, or an error saying why it is not a daemon the plugin runs.
func (m *Manager) daemonPID(ctx context.Context, key string) (int, error) {
	pipeDir, _, err := m.controlDirs(key)
	if err != nil {
		return 0, err
	}
	dialer := net.Dialer{Timeout: m.timeout()}
	conn, err := dialer.DialContext(ctx, "unix", filepath.Join(pipeDir, controlSocket))
	if err != nil {
		return 0, fmt.Errorf("MPS daemon %s: %w", key, err)
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("MPS daemon %s: a unix dial gave a %T", key, conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, err
	}
	if credErr != nil {
		return 0, fmt.Errorf("MPS daemon %s: who listens on its control socket: %w", key, credErr)
	}
	notOurs := func(why string) error {
		return fmt.Errorf("MPS daemon %s: the process listening on %s %s, so it is not a daemon the plugin runs; its pipe directory is mounted read-write into its isolation domain's containers, and a tenant of that domain put its own socket there",
			key, filepath.Join(m.PipeDir(key), controlSocket), why)
	}
	// The kernel gives 0 for a process outside the caller's PID namespace.
	if cred.Pid <= 0 {
		return 0, notOurs("runs outside the plugin's PID namespace")
	}
	own, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return 0, err
	}
	peer, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", cred.Pid))
	if err != nil {
		return 0, notOurs(fmt.Sprintf("(PID %d) cannot be looked at: %v", cred.Pid, err))
	}
	if peer != own {
		return 0, notOurs(fmt.Sprintf("(PID %d) runs in a PID namespace of its own, as a container's process does", cred.Pid))
	}
	return int(cred.Pid), nil
}

// parentPID is a process's parent, from /proc/<pid>/stat.
func parentPID(pid int) (int, error) {
	raw, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// The command may hold spaces and parentheses: the fields follow its last ")".
	i := strings.LastIndexByte(string(raw), ')')
	if i < 0 {
		return 0, errors.New("malformed stat")
	}
	f := strings.Fields(string(raw[i+1:]))
	if len(f) < 2 {
		return 0, errors.New("malformed stat")
	}
	return strconv.Atoi(f[1])
}
