package main

// The MPS control daemons of the GPU check run as the DaemonSet's plugin runs them, in the
// shape of their pods: the command mps.Manager.Spec builds, in the host's PID and IPC
// namespaces, in a mount namespace of their own whose /dev/shm is the daemon's shm directory
// (the tmpfs its clients mount), in a session of their own, so that killing the plugin leaves
// them running.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fgpu-dev/fgpu/pkg/mps"
)

const daemonSpecEnv = "GPUCHECK_MPS_DAEMON_SPEC"

// launcherPIDFile holds the PID of the daemon this launcher started, in the daemon's directory:
// not the daemon's own PID file in the pipe directory, which its tenants can write.
const launcherPIDFile = "launcher.pid"

// hostLauncher is an mps.Launcher for a node without Kubernetes.
type hostLauncher struct{ root string }

var _ mps.Launcher = hostLauncher{}

func (l hostLauncher) Start(ctx context.Context, spec mps.DaemonSpec, replace bool) (bool, error) {
	if _, ok := l.pid(spec.Key); ok {
		if !replace {
			return false, nil // running: adopted as it is
		}
		if err := l.Stop(ctx, spec.Key); err != nil {
			return false, err
		}
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return false, err
	}
	// A daemon that died leaves its pipe files behind; the new one needs them gone.
	if entries, err := os.ReadDir(spec.PipeDir); err == nil {
		for _, e := range entries {
			_ = os.RemoveAll(filepath.Join(spec.PipeDir, e.Name()))
		}
	}
	cmd := exec.Command("/proc/self/exe", "mps-daemon-init")
	cmd.Env = append(os.Environ(), daemonSpecEnv+"="+string(raw))
	logFile, err := os.OpenFile(filepath.Join(spec.Dir, "daemon.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return false, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Cloneflags: syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("start MPS daemon %s: %w", spec.Key, err)
	}
	// It must outlive this process, as a pod outlives the plugin, which finds it again by
	// this file.
	if err := os.WriteFile(filepath.Join(spec.Dir, launcherPIDFile), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		_ = cmd.Process.Kill()
		return false, fmt.Errorf("record MPS daemon %s: %w", spec.Key, err)
	}
	// Reaped should it exit while this process lives (a plugin that stops its own daemons,
	// as the faults check's does): Stop waits for the PID to go, which a zombie never does.
	go func() { _ = cmd.Wait() }()
	return true, nil
}

func (l hostLauncher) Stop(_ context.Context, key string) error {
	pid, ok := l.pid(key)
	if !ok {
		return nil
	}
	_ = unix.Kill(pid, unix.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if unix.Kill(pid, 0) != nil {
			return nil
		}
	}
	return fmt.Errorf("MPS daemon %s (PID %d) did not exit within 10s", key, pid)
}

// Keys: the manager's directories are the daemons this launcher started.
func (l hostLauncher) Keys(context.Context) ([]string, error) { return nil, nil }

func (l hostLauncher) Describe(_ context.Context, key string) string {
	if pid, ok := l.pid(key); ok {
		return fmt.Sprintf("host process %d", pid)
	}
	out, _ := os.ReadFile(filepath.Join(l.root, key, "daemon.out"))
	return "not running; its output: " + strings.TrimSpace(string(out))
}

// pid is the PID of the daemon this launcher started for key, if that process lives.
func (l hostLauncher) pid(key string) (int, bool) {
	raw, err := os.ReadFile(filepath.Join(l.root, key, launcherPIDFile))
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil || pid <= 0 || unix.Kill(pid, 0) != nil {
		return 0, false
	}
	return pid, true
}

// daemonInit runs in the daemon's new mount namespace: its /dev/shm becomes the daemon's
// shm directory, as in its pod, and the daemon's command replaces this process.
func daemonInit() error {
	var spec mps.DaemonSpec
	if err := json.Unmarshal([]byte(os.Getenv(daemonSpecEnv)), &spec); err != nil {
		return fmt.Errorf("read the daemon spec: %w", err)
	}
	if len(spec.Command) == 0 {
		return errors.New("the daemon spec has no command")
	}
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make mounts private: %w", err)
	}
	if err := unix.Mount(spec.ShmDir, "/dev/shm", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s on /dev/shm: %w", spec.ShmDir, err)
	}
	path, err := exec.LookPath(spec.Command[0])
	if err != nil {
		return err
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, daemonSpecEnv+"=") {
			env = append(env, kv)
		}
	}
	return unix.Exec(path, spec.Command, append(env, spec.Env...))
}
