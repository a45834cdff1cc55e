package reaper

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const helperEnv = "FGPU_REAPER_TEST_HELPER"

// TestMain plays the processes of the tests: "detach" starts a daemon in its own session and
// exits at once, as nvidia-cuda-mps-control -d does; "daemon" runs a moment and exits;
// "exit3" exits with status 3.
func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "detach":
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), helperEnv+"=daemon")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0)
	case "daemon":
		time.Sleep(100 * time.Millisecond)
		os.Exit(0)
	case "exit3":
		os.Exit(3)
	}
	// The plugin is PID 1 of its container: orphans come to it.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		panic(err)
	}
	os.Exit(m.Run())
}

func helper(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	return cmd
}

func processState(pid int) byte {
	st, err := readStat(pid)
	if err != nil {
		return 0 // gone
	}
	return st.state
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
	}
}

// A daemon that detached and then exited, as a stopped MPS control daemon does, is reaped.
func TestDetachedDaemonsAreReaped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Start(ctx); err != nil {
		t.Fatal(err)
	}
	var pids []int
	for range 5 {
		out, err := helper("detach").Output()
		if err != nil {
			t.Fatal(err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	for _, pid := range pids {
		waitFor(t, fmt.Sprintf("daemon %d stayed behind as a zombie", pid), func() bool { return processState(pid) == 0 })
	}
}

// A child that an exec.Cmd started keeps its exit status for the Cmd's Wait, however long
// after its exit that comes, while the reaper runs.
func TestChildrenStartedHereAreLeftToTheirWait(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Start(ctx); err != nil {
		t.Fatal(err)
	}
	cmd := helper("exit3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	waitFor(t, "the child did not exit", func() bool { return processState(pid) == 'Z' })
	// Let the reaper see the SIGCHLD and another one.
	time.Sleep(200 * time.Millisecond)
	if err := unix.Kill(os.Getpid(), unix.SIGCHLD); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("Wait = %v, want exit status 3", err)
	}
	// Many short commands at once, as prepares run them.
	errs := make(chan error, 20)
	for range 20 {
		go func() { errs <- exec.Command("true").Run() }()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Fatalf("a command lost its exit status to the reaper: %v", err)
		}
	}
}

// A zombie child of the session that no one waited for within Grace is reaped too.
func TestForgottenChildrenAreReapedAfterGrace(t *testing.T) {
	cmd := helper("exit3")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	waitFor(t, "the child did not exit", func() bool { return processState(pid) == 'Z' })
	r := &reaper{seen: map[int]time.Time{}}
	now := time.Now()
	r.reap(context.Background(), now)
	if processState(pid) != 'Z' {
		t.Fatal("reaped a child of the session at once")
	}
	r.reap(context.Background(), now.Add(Grace))
	if processState(pid) != 0 {
		t.Fatal("a child no one waited for within Grace is still a zombie")
	}
	if len(r.seen) != 0 {
		t.Fatalf("still remembers %v", r.seen)
	}
}
