// Package mps runs one MPS control daemon per GPU and isolation domain, each with its own
// pipe, log and shm directories, through nvidia-cuda-mps-control's own command interface. The
// fake backend points Binary at a stand-in that speaks the same interface, so this code
// path is the one real GPUs use.
//
// In a cluster each daemon runs in a pod of its own (PodLauncher), so that it outlives the
// plugin's container; without a Launcher it runs as a detached child (`-d`), as the GPU check
// does without Kubernetes.
package mps

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	"k8s.io/klog/v2"
)

// Daemon identifies one control daemon: a GPU and the isolation domain it serves. A domain is
// always the pair (namespace, sub-domain): the sub-domain, which a claim may name, only
// subdivides its own namespace, so no claim can name its way onto another namespace's server.
type Daemon struct {
	GPUUUID   string
	Namespace string
	// Domain is the sub-domain within Namespace (a DNS label; "default" when unnamed).
	Domain string
}

// Name is the domain in words: "<namespace>/<sub-domain>".
func (d Daemon) Name() string { return d.Namespace + "/" + d.Domain }

// Key is the daemon's directory name under the manager's root; it is stable, so a
// restarted plugin finds the daemons it started before. Its readable prefix may be cut; the
// hash covers the whole identity (neither a UUID nor a namespace contains '/', and a
// sub-domain is a DNS label, so the hashed string is unambiguous) with 128 bits, so that no
// tenant can search out a sub-domain whose key collides with another namespace's. It stays
// short because the pipe directory holds a unix socket, whose path may not exceed 107 bytes.
func (d Daemon) Key() string {
	prefix := d.Namespace + "-" + d.Domain
	if len(prefix) > keyPrefixMax {
		prefix = strings.TrimRight(prefix[:keyPrefixMax], "-")
	}
	sum := sha256.Sum256([]byte(d.GPUUUID + "/" + d.Namespace + "/" + d.Domain))
	return fmt.Sprintf("%s_%x", prefix, sum[:16])
}

const (
	keyPrefixMax = 20
	keyMax       = keyPrefixMax + 1 + 32
	// socketPathMax is what sockaddr_un holds, less its terminating NUL.
	socketPathMax = 107
	// controlSocket is the longest name the control daemon creates in its pipe directory.
	controlSocket = "control"
	// maxReply bounds what one control command may answer, and maxServers how many servers
	// get_server_list may name: a tenant's socket in place of the daemon's may answer without
	// end. The commands the plugin sends are answered in a line.
	maxReply   = 8 << 10
	maxServers = 16
)

// CheckRoot says whether a daemon root is short enough for every daemon's control socket:
// a longer one would fail only at a tenant's first prepare, with the kernel's "invalid
// argument", so the plugin refuses it at start.
func CheckRoot(root string) error {
	root = filepath.Clean(root)
	if n := len(filepath.Join(root, strings.Repeat("k", keyMax), "pipe", controlSocket)); n > socketPathMax {
		return fmt.Errorf("MPS directory %q is %d bytes too long: the control socket of a daemon under it would take %d bytes, more than the %d a unix socket path can hold; use a shorter state directory",
			root, n-socketPathMax, n, socketPathMax)
	}
	return nil
}

// keyRE also accepts the 48-bit keys of earlier versions, so that a restarted plugin still
// restarts or stops the daemons its checkpoint names.
var keyRE = regexp.MustCompile(`^[a-z0-9-]+_([0-9a-f]{32}|[0-9a-f]{12})$`)

// Limits are the server-side defaults: a client can only lower them, so they bound a
// tenant that drops the per-claim environment.
type Limits struct {
	PinnedMemBytes int64 // 0: no default
	ThreadPercent  int64 // 0: no default
}

// Manager starts, configures and stops control daemons under Root.
type Manager struct {
	Root   string
	Binary string
	// DaemonEnv, if set, adds to the environment of the daemon started for a GPU.
	DaemonEnv func(gpuUUID string) []string
	// Timeout bounds one control command.
	Timeout time.Duration
	// Launcher runs each daemon outside this process (a pod); nil: a detached child.
	Launcher Launcher
	// StartTimeout bounds the wait for a launched daemon to answer (default 30s: the
	// kubelet gives a prepare 45s).
	StartTimeout time.Duration
	// ShmSize, if set, makes each daemon's shm directory a tmpfs of that many bytes, shared
	// by its server (as /dev/shm) and its clients.
	ShmSize int64

	mu sync.Mutex
	// applied remembers the defaults each daemon was last given, to skip a control
	// round-trip per prepare when they did not change.
	applied map[string]Limits
	// keys serialise the starts and stops of each daemon, so that the callers need not hold
	// a lock of their own while a daemon starts; replaced is when each daemon that ran
	// without answering was last replaced.
	keys     map[string]*sync.Mutex
	replaced map[string]time.Time
	// view is the directory open on the view of Root that control commands go through
	// (OpenControlView).
	view *os.File
}

// replaceEvery bounds how often a daemon that runs without answering is replaced: a
// tenant can wedge its own domain's daemon (its pipe directory is mounted read-write), and
// must not make the plugin churn pods for it.
const replaceEvery = 30 * time.Second

// lock holds daemon key's lock; the returned function releases it.
func (m *Manager) lock(key string) func() {
	m.mu.Lock()
	if m.keys == nil {
		m.keys = map[string]*sync.Mutex{}
	}
	l := m.keys[key]
	if l == nil {
		l = &sync.Mutex{}
		m.keys[key] = l
	}
	m.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// PipeDir is where clients find the daemon (CUDA_MPS_PIPE_DIRECTORY).
func (m *Manager) PipeDir(key string) string { return filepath.Join(m.Root, key, "pipe") }

// LogDir is the daemon's log directory (CUDA_MPS_LOG_DIRECTORY).
func (m *Manager) LogDir(key string) string { return filepath.Join(m.Root, key, "log") }

// ShmDir is shared by the daemon's clients as their /dev/shm.
func (m *Manager) ShmDir(key string) string { return filepath.Join(m.Root, key, "shm") }

// Spec is how daemon key runs for GPU gpuUUID: in the foreground, with its directories in
// the environment. One function, so that every launcher runs the same command.
func (m *Manager) Spec(key, gpuUUID string) DaemonSpec {
	env := []string{
		api.EnvMPSPipeDirectory + "=" + m.PipeDir(key),
		api.EnvMPSLogDirectory + "=" + m.LogDir(key),
		"CUDA_VISIBLE_DEVICES=" + gpuUUID,
	}
	if m.DaemonEnv != nil {
		env = append(env, m.DaemonEnv(gpuUUID)...)
	}
	return DaemonSpec{
		Key: key, GPUUUID: gpuUUID, Command: []string{m.Binary, "-f"}, Env: env,
		Dir: filepath.Join(m.Root, key), PipeDir: m.PipeDir(key), ShmDir: m.ShmDir(key),
	}
}

// Running reports whether the daemon answers on its pipe directory.
func (m *Manager) Running(ctx context.Context, key string) bool {
	_, err := m.control(ctx, key, nil, "get_server_list")
	return err == nil
}

// ServerPIDs lists the PIDs of the daemon's MPS servers (get_server_list): processes NVML
// lists on the daemon's GPU that fgpu started, which are never counted as foreign. So the
// answer is trusted only as far as it is checked (peer.go): the daemon must be one the plugin
// runs, and each PID one of its servers; the PIDs that are not are left out, and named in the
// error beside the PIDs that are.
func (m *Manager) ServerPIDs(ctx context.Context, key string) ([]int, error) {
	daemon, err := m.daemonPID(ctx, key)
	if err != nil {
		return nil, err
	}
	listed, err := m.serverList(ctx, key)
	if err != nil {
		return nil, err
	}
	var pids, strangers []int
	for _, pid := range listed {
		if parent, err := parentPID(pid); pid == daemon || err == nil && parent == daemon {
			pids = append(pids, pid)
		} else {
			strangers = append(strangers, pid)
		}
	}
	if len(strangers) > 0 {
		return pids, fmt.Errorf("MPS daemon %s (PID %d) listed %v as its servers, which are not its children: ignored", key, daemon, strangers)
	}
	return pids, nil
}

// serverList is the daemon's get_server_list answer, unchecked: whoever holds the pipe
// directory may have given it, so only that domain's own handling may rest on it.
func (m *Manager) serverList(ctx context.Context, key string) ([]int, error) {
	out, err := m.control(ctx, key, nil, "get_server_list")
	if err != nil {
		return nil, fmt.Errorf("list the servers of MPS daemon %s: %w: %s", key, err, out)
	}
	fields := strings.Fields(out)
	if len(fields) > maxServers {
		return nil, fmt.Errorf("MPS daemon %s listed %d servers; a control daemon runs one at a time for each user, so this is not its answer", key, len(fields))
	}
	var pids []int
	for _, f := range fields {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("MPS daemon %s listed server %q, not a PID", key, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// FaultedServers lists the daemon's MPS servers whose get_server_status is FAULT: after a
// fatal fault of one client, NVIDIA's server refuses new clients until all of its clients
// have exited (its other clients were hit by the fault too). Only the daemon's own domain is
// moved for it, so its answers are taken as they come; the whole check takes one command's
// timeout, however many servers the answer names.
func (m *Manager) FaultedServers(ctx context.Context, key string) ([]int, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout())
	defer cancel()
	pids, err := m.serverList(ctx, key)
	if err != nil {
		return nil, err
	}
	var faulted []int
	for _, pid := range pids {
		out, err := m.control(ctx, key, nil, "get_server_status "+strconv.Itoa(pid))
		if ctx.Err() != nil {
			return nil, fmt.Errorf("MPS daemon %s did not tell its servers' states within %s", key, m.timeout())
		}
		if err != nil {
			// The server may have exited between the two commands.
			continue
		}
		if strings.EqualFold(strings.TrimSpace(out), "FAULT") {
			faulted = append(faulted, pid)
		}
	}
	return faulted, nil
}

// Ensure starts the daemon with directory key on GPU gpuUUID if it is not running and sets
// its defaults; started says a new daemon was started (none ran, or one that ran without
// answering was replaced), so the clients of any earlier one lost their server; a launched
// daemon that is adopted and answers was not started. Idempotent, and never runs a second
// daemon for a key: a launched one that does not answer yet is waited for. The key is the
// one recorded when the claim was planned (Daemon.Key then), so that a daemon started by an
// earlier version keeps serving its claims. Calls for one key are serialised.
func (m *Manager) Ensure(ctx context.Context, key, gpuUUID string, limits Limits) (started bool, err error) {
	if !keyRE.MatchString(key) {
		return false, fmt.Errorf("refusing to start MPS daemon with malformed key %q", key)
	}
	defer m.lock(key)()
	for _, dir := range []string{m.PipeDir(key), m.LogDir(key), m.ShmDir(key)} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return false, fmt.Errorf("create MPS directory: %w", err)
		}
	}
	if m.ShmSize > 0 {
		if err := mountShm(m.ShmDir(key), m.ShmSize); err != nil {
			return false, err
		}
	}
	running := m.Running(ctx, key)
	if !running {
		m.forget(key)
	}
	// A launched daemon that answers may still be on its way out (its pod deleted, within its
	// grace period): the Launcher is asked too, so that no new client joins a dying server.
	if !running || m.Launcher != nil {
		started, err = m.start(ctx, key, gpuUUID)
		if started {
			m.forget(key)
		}
		switch {
		case err != nil && running && !started:
			// The Launcher could not tell (the API server did not answer): the daemon answers,
			// so it serves, as it would have before that check.
			klog.FromContext(ctx).Error(err, "Could not check whether an answering MPS daemon's pod is being deleted; using the daemon", "daemon", key)
		case err != nil:
			return started, err
		}
	}
	return started, m.setDefaults(ctx, key, gpuUUID, limits)
}

func (m *Manager) start(ctx context.Context, key, gpuUUID string) (created bool, err error) {
	if m.Launcher != nil {
		return m.launch(ctx, key, gpuUUID)
	}
	// A daemon killed with its container leaves its pipe files; a new one needs them gone.
	if err := clearDir(m.PipeDir(key)); err != nil {
		return false, err
	}
	env := []string{"CUDA_VISIBLE_DEVICES=" + gpuUUID}
	if m.DaemonEnv != nil {
		env = append(env, m.DaemonEnv(gpuUUID)...)
	}
	// The daemon itself gets the real directories: the view is the plugin's, and only for
	// the commands it sends.
	if out, err := m.run(ctx, m.PipeDir(key), m.LogDir(key), env, nil, "-d"); err != nil {
		return true, fmt.Errorf("start MPS control daemon %s for GPU %s: %w: %s", key, gpuUUID, err, out)
	}
	return true, nil
}

// launch starts or adopts the daemon through the Launcher and waits for it to answer. An
// adopted daemon that runs but does not answer (a tenant removed or replaced its control
// socket) is replaced, at most once per replaceEvery.
func (m *Manager) launch(ctx context.Context, key, gpuUUID string) (bool, error) {
	spec := m.Spec(key, gpuUUID)
	created, err := m.Launcher.Start(ctx, spec, false)
	if err != nil {
		return created, fmt.Errorf("start MPS control daemon %s for GPU %s: %w", key, gpuUUID, err)
	}
	err = m.waitAnswering(ctx, key, gpuUUID)
	if err == nil || created || ctx.Err() != nil {
		return created, err
	}
	m.mu.Lock()
	last, ok := m.replaced[key]
	m.mu.Unlock()
	if ok && time.Since(last) < replaceEvery {
		return false, fmt.Errorf("%w; it was replaced %s ago and is not replaced again before %s have passed", err, time.Since(last).Round(time.Second), replaceEvery)
	}
	created, rerr := m.Launcher.Start(ctx, spec, true)
	if rerr != nil {
		return created, fmt.Errorf("%w; replacing it: %w", err, rerr)
	}
	if !created {
		return false, err // still starting: waited for again by the next call
	}
	m.mu.Lock()
	if m.replaced == nil {
		m.replaced = map[string]time.Time{}
	}
	m.replaced[key] = time.Now()
	m.mu.Unlock()
	return true, m.waitAnswering(ctx, key, gpuUUID)
}

// waitAnswering waits, bounded, for a launched daemon to answer on its pipe directory.
func (m *Manager) waitAnswering(ctx context.Context, key, gpuUUID string) error {
	timeout := m.StartTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	deadline := time.Now().Add(timeout)
	for !m.Running(ctx, key) {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("MPS control daemon %s for GPU %s did not answer within %s: %s", key, gpuUUID, timeout, m.Launcher.Describe(ctx, key))
		}
		// A daemon pod answers about half a second after it was made: a claim's prepare waits
		// for it, and a coarse poll would add most of a period to every first claim.
		time.Sleep(answerPoll)
	}
	return nil
}

// answerPoll is how often waitAnswering asks a starting daemon; each ask runs the control
// client once.
const answerPoll = 25 * time.Millisecond

func (m *Manager) setDefaults(ctx context.Context, key, gpuUUID string, limits Limits) error {
	if m.unchanged(key, limits) {
		return nil
	}
	var cmds []string
	if limits.ThreadPercent > 0 {
		cmds = append(cmds, fmt.Sprintf("set_default_active_thread_percentage %d", limits.ThreadPercent))
	}
	if limits.PinnedMemBytes > 0 {
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit 0 %dM", limits.PinnedMemBytes>>20))
	}
	if len(cmds) > 0 {
		if out, err := m.control(ctx, key, nil, cmds...); err != nil {
			return fmt.Errorf("set MPS defaults of daemon %s for GPU %s: %w: %s", key, gpuUUID, err, out)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied == nil {
		m.applied = map[string]Limits{}
	}
	m.applied[key] = limits
	return nil
}

func (m *Manager) unchanged(key string, l Limits) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev, ok := m.applied[key]
	return ok && prev == l
}

func (m *Manager) forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.applied, key)
}

// Stop quits the daemon and removes its directories. Idempotent.
func (m *Manager) Stop(ctx context.Context, key string) error {
	return m.StopUnlessUsed(ctx, key, nil)
}

// StopUnlessUsed is Stop, unless used (if set) says, once the calls for key before it are
// done, that the daemon is in use: the caller decided to stop it without holding a lock
// that an Ensure for key waits for, and that Ensure may have come first.
func (m *Manager) StopUnlessUsed(ctx context.Context, key string, used func() bool) error {
	if !keyRE.MatchString(key) {
		return fmt.Errorf("refusing to stop MPS daemon with malformed key %q", key)
	}
	defer m.lock(key)()
	if used != nil && used() {
		return nil
	}
	if m.Running(ctx, key) {
		if out, err := m.control(ctx, key, nil, "quit"); err != nil {
			return fmt.Errorf("stop MPS control daemon %s: %w: %s", key, err, out)
		}
		if err := m.waitStopped(ctx, key); err != nil {
			return err
		}
	}
	if m.Launcher != nil {
		if err := m.Launcher.Stop(ctx, key); err != nil {
			return fmt.Errorf("stop MPS control daemon %s: %w", key, err)
		}
	}
	m.forget(key)
	m.mu.Lock()
	delete(m.replaced, key)
	m.mu.Unlock()
	if err := unmountShm(m.ShmDir(key)); err != nil {
		return err
	}
	if err := m.removeDirs(key); err != nil {
		return fmt.Errorf("remove MPS directories of %s: %w", key, err)
	}
	return nil
}

// Keys lists the daemons present, running or not: their directories under Root, and the
// daemons launched (pods) whose directories are gone.
func (m *Manager) Keys(ctx context.Context) ([]string, error) {
	keys, err := m.DirKeys()
	if err != nil {
		return nil, err
	}
	if m.Launcher != nil {
		launched, err := m.Launcher.Keys(ctx)
		if err != nil {
			return nil, err
		}
		for _, k := range launched {
			if keyRE.MatchString(k) && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	return keys, nil
}

// DirKeys lists the daemon directories present under Root: the daemons that can be asked
// on their pipe directory.
func (m *Manager) DirKeys() ([]string, error) {
	entries, err := os.ReadDir(m.Root)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, e := range entries {
		if e.IsDir() && keyRE.MatchString(e.Name()) {
			keys = append(keys, e.Name())
		}
	}
	return keys, nil
}

// removeDirs removes a stopped daemon's directories. A daemon stops answering before it has
// exited and may still write its last log lines, so a directory that refills while it is
// removed is tried again until the timeout.
func (m *Manager) removeDirs(key string) error {
	deadline := time.Now().Add(m.timeout())
	for {
		err := os.RemoveAll(filepath.Join(m.Root, key))
		if !errors.Is(err, syscall.ENOTEMPTY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (m *Manager) waitStopped(ctx context.Context, key string) error {
	deadline := time.Now().Add(m.timeout())
	for m.Running(ctx, key) {
		if time.Now().After(deadline) {
			return fmt.Errorf("MPS control daemon %s did not quit within %s", key, m.timeout())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// control sends commands to daemon key through the view that follows no symlink.
func (m *Manager) control(ctx context.Context, key string, env []string, cmds ...string) (string, error) {
	pipeDir, logDir, err := m.controlDirs(key)
	if err != nil {
		return "", err
	}
	return m.run(ctx, pipeDir, logDir, env, []byte(strings.Join(cmds, "\n")+"\n"))
}

// run runs the control binary, bounded in time (the timeout) and in what it may answer
// (maxReply): past either it is killed.
func (m *Manager) run(ctx context.Context, pipeDir, logDir string, env []string, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.timeout())
	defer cancel()
	cmd := exec.CommandContext(ctx, m.Binary, args...)
	cmd.Env = append(os.Environ(),
		api.EnvMPSPipeDirectory+"="+pipeDir,
		api.EnvMPSLogDirectory+"="+logDir)
	cmd.Env = append(cmd.Env, env...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out := &replyBuffer{kill: cancel}
	cmd.Stdout, cmd.Stderr = out, out
	// Nothing it started may hold its output open past the kill.
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if out.overflow {
		return "", fmt.Errorf("the answer exceeded %d bytes, more than any MPS control command answers", maxReply)
	}
	return strings.TrimSpace(out.buf.String()), err
}

// replyBuffer holds a control command's output up to maxReply, and kills the command past
// it. It has only Write, so that nothing copies into it around the bound.
type replyBuffer struct {
	buf      bytes.Buffer
	kill     context.CancelFunc
	overflow bool
}

func (b *replyBuffer) Write(p []byte) (int, error) {
	if b.buf.Len()+len(p) > maxReply {
		b.overflow = true
		b.kill()
		return 0, errors.New("MPS control answer too long")
	}
	return b.buf.Write(p)
}

func (m *Manager) timeout() time.Duration {
	if m.Timeout > 0 {
		return m.Timeout
	}
	return 10 * time.Second
}

func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("clear stale MPS pipe directory: %w", err)
		}
	}
	return nil
}
