package mps

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// tenantSocket replaces daemon key's control socket with one served by this process, as a
// tenant can (its pipe directory is mounted read-write into its containers), which answers
// every connection with answer.
func tenantSocket(t *testing.T, m *Manager, key string, answer []byte) {
	t.Helper()
	ctl := filepath.Join(m.PipeDir(key), controlSocket)
	if err := os.MkdirAll(m.PipeDir(key), 0o755); err != nil {
		t.Fatal(err)
	}
	_ = os.Remove(ctl)
	l, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c)
				_, _ = c.Write(answer)
			}()
		}
	}()
}

// A tenant's socket answers get_server_list with processes that are not fgpu's MPS servers
// (init, another workload): none of them is taken for one.
func TestServerPIDsKeepsOnlyTheDaemonsServers(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	tenantSocket(t, m, key, []byte("1 "+strconv.Itoa(os.Getppid())+"\n"))
	pids, err := m.ServerPIDs(ctx, key)
	if len(pids) != 0 || err == nil || !strings.Contains(err.Error(), "not its children") {
		t.Fatalf("ServerPIDs = %v, %v; want none, and an error naming the strangers", pids, err)
	}
}

// A tenant runs the control binary itself in its container (the driver's files are in it),
// in its own PID namespace: its daemon answers with its own PID there, 1, which is the node's
// init. The plugin does not take it for one of its daemons.
func TestServerPIDsRefusesADaemonInAnotherPIDNamespace(t *testing.T) {
	ctx := context.Background()
	bin := buildStandIn(t)
	m := viewed(t, &Manager{Root: shortDir(t), Binary: bin})
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	if err := os.MkdirAll(m.PipeDir(key), 0o755); err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	cmd := exec.Command(bin, "-f")
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+m.PipeDir(key), "CUDA_MPS_LOG_DIRECTORY="+logDir,
		fakecontrol.ProcessFileEnv+"="+filepath.Join(t.TempDir(), "processes"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if st, err := fakecontrol.ReadState(logDir); err == nil && st.PID == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the tenant's daemon did not start")
		}
	}
	if out, err := m.control(ctx, key, nil, "set_default_active_thread_percentage 100"); err != nil {
		t.Fatalf("starting the tenant's stand-in server: %v: %s", err, out)
	}
	if listed, err := m.serverList(ctx, key); err != nil || len(listed) != 1 || listed[0] != 1 {
		t.Fatalf("the tenant's daemon lists %v, %v; want [1], or this test shows nothing", listed, err)
	}
	pids, err := m.ServerPIDs(ctx, key)
	if len(pids) != 0 || err == nil || !strings.Contains(err.Error(), "PID namespace of its own") {
		t.Fatalf("ServerPIDs = %v, %v; want none, and an error saying the listener is a container's", pids, err)
	}
}

// The daemon the plugin started lists its server (the stand-in serves as its own).
func TestServerPIDsOfARealDaemon(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	m.DaemonEnv = func(string) []string {
		return []string{fakecontrol.ProcessFileEnv + "=" + filepath.Join(t.TempDir(), "processes")}
	}
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, key, "GPU-1", Limits{ThreadPercent: 100}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Stop(ctx, key) })
	st, err := fakecontrol.ReadState(m.LogDir(key))
	if err != nil {
		t.Fatal(err)
	}
	if pids, err := m.ServerPIDs(ctx, key); err != nil || len(pids) != 1 || pids[0] != st.PID {
		t.Fatalf("ServerPIDs = %v, %v; want [%d]", pids, err, st.PID)
	}
}

// A tenant's socket answers a control command with more than any command answers: the
// plugin neither keeps it nor believes it.
func TestAnOversizedAnswerIsRefused(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t)})
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	tenantSocket(t, m, key, bytes.Repeat([]byte(strconv.Itoa(os.Getpid())+" "), 1<<20))
	for name, cmd := range map[string]func() error{
		"ServerPIDs":     func() error { _, err := m.ServerPIDs(ctx, key); return err },
		"FaultedServers": func() error { _, err := m.FaultedServers(ctx, key); return err },
	} {
		if err := cmd(); err == nil || !strings.Contains(err.Error(), "exceeded") {
			t.Errorf("%s: %v; want the answer refused as too long", name, err)
		}
	}
}

// A tenant's socket names many servers, each of which hangs its status: the domain's check
// still ends within one command's timeout, so that it delays no other domain's.
func TestFaultedServersEndsWithinOneTimeout(t *testing.T) {
	ctx := context.Background()
	m := viewed(t, &Manager{Root: shortDir(t), Binary: buildStandIn(t), Timeout: time.Second})
	key := Daemon{GPUUUID: "GPU-1", Namespace: "team-a", Domain: "default"}.Key()
	ctl := filepath.Join(m.PipeDir(key), controlSocket)
	if err := os.MkdirAll(m.PipeDir(key), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done := make(chan struct{})
	t.Cleanup(func() { close(done) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				if strings.HasPrefix(string(buf[:n]), "get_server_list") {
					_, _ = c.Write([]byte("11 12 13 14 15 16 17 18\n"))
					return
				}
				<-done // a status is never answered
			}()
		}
	}()
	start := time.Now()
	if _, err := m.FaultedServers(ctx, key); err == nil {
		t.Error("hanging answers gave no error")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("FaultedServers took %s; want about one timeout (%s)", took, m.Timeout)
	}
}
