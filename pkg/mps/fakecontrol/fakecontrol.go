// Package fakecontrol is a stand-in for nvidia-cuda-mps-control on machines without a GPU.
// It speaks the same interface (-d to start a daemon, -f to run one in the foreground, as a
// daemon pod does; commands on stdin, with
// CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY in the environment) and records the
// limits it was given in StateFile under the log directory, so tests and the demo can show
// what a real daemon would have enforced.
package fakecontrol

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// StateFile is the name of the JSON state file in the log directory.
const StateFile = "fake-mps-state.json"

const daemonEnv = "FGPU_FAKE_MPS_DAEMON"

// ProcessFileEnv names the fake GPU's process file (the fake backend's ProcessFile). The
// daemon stands in for the MPS server too, so it lists its PID there while its server runs,
// as NVML lists a real MPS server among the GPU's compute processes, and answers
// get_server_list with it. A real control daemon starts its server when the first client
// connects; the stand-in has no clients, so its server starts when it is first told a
// default (the plugin does that as a claim's domain takes the daemon, just before the
// claim's containers start): a daemon started ahead, that no domain took, runs no server.
const ProcessFileEnv = "FGPU_FAKE_GPU_PROCESS_FILE"

// FaultFile, in the log directory, puts the stand-in server in the state NVIDIA's server
// takes after a fatal fault of a client: get_server_status answers FAULT (it refuses new
// clients until all of its clients exited) while the file exists, ACTIVE otherwise.
const FaultFile = "fake-mps-fault"

// State is what the stand-in daemon was told.
type State struct {
	PID                           int               `json:"pid"`
	VisibleDevices                string            `json:"visibleDevices"`
	DefaultActiveThreadPercentage string            `json:"defaultActiveThreadPercentage,omitempty"`
	DefaultPinnedMemLimit         map[string]string `json:"defaultPinnedMemLimit,omitempty"`
}

// ReadState reads the state a daemon recorded in logDir.
func ReadState(logDir string) (State, error) {
	var s State
	raw, err := os.ReadFile(filepath.Join(logDir, StateFile))
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(raw, &s)
}

// Main runs the stand-in with the given arguments and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipeDir, logDir := os.Getenv("CUDA_MPS_PIPE_DIRECTORY"), os.Getenv("CUDA_MPS_LOG_DIRECTORY")
	if pipeDir == "" || logDir == "" {
		fmt.Fprintln(stderr, "CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY must be set")
		return 2
	}
	sock := filepath.Join(pipeDir, "control")
	switch {
	case os.Getenv(daemonEnv) == "1":
		if err := serve(sock, logDir); err != nil {
			logf(logDir, "daemon failed: "+err.Error())
			return 1
		}
		return 0
	case len(args) == 1 && args[0] == "-f":
		if answers(sock) {
			fmt.Fprintln(stderr, errAlreadyRunning)
			return 1
		}
		if err := serve(sock, logDir); err != nil {
			fmt.Fprintln(stderr, "daemon failed:", err)
			logf(logDir, "daemon failed: "+err.Error())
			return 1
		}
		return 0
	case len(args) == 1 && args[0] == "-d":
		if err := daemonize(sock); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		return 0
	case len(args) == 0:
		return client(sock, stdin, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "usage: %s [-d|-f]\n", filepath.Base(os.Args[0]))
		return 2
	}
}

// daemonize re-runs this binary as a detached daemon and waits until it listens, as the
// real control binary returns only once the daemon is up.
func daemonize(sock string) error {
	if answers(sock) {
		return errAlreadyRunning
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), daemonEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start daemon: %w", err)
	}
	// Reaps the daemon should it exit early; its exit status has no reader.
	go func() { _ = cmd.Wait() }()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return nil
		}
	}
	return errors.New("daemon did not start listening within 5s")
}

// PIDFile is the control daemon's PID file in its pipe directory.
const PIDFile = "nvidia-cuda-mps-control.pid"

var errAlreadyRunning = errors.New("An instance of this daemon is already running") //nolint:staticcheck // ST1005: the real control binary's words

// answers says whether a daemon listens on sock.
func answers(sock string) bool {
	c, err := net.Dial("unix", sock)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

func serve(sock, logDir string) error {
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	st := State{PID: os.Getpid(), VisibleDevices: os.Getenv("CUDA_VISIBLE_DEVICES"), DefaultPinnedMemLimit: map[string]string{}}
	if err := st.save(logDir); err != nil {
		return err
	}
	// As the real daemon does: its PID, in the pipe directory, for whoever looks after it.
	pidFile := filepath.Join(filepath.Dir(sock), PIDFile)
	if err := os.WriteFile(pidFile, []byte(strconv.Itoa(st.PID)+"\n"), 0o644); err != nil {
		return err
	}
	defer os.Remove(pidFile)
	srv := &server{file: os.Getenv(ProcessFileEnv), pid: st.PID}
	defer func() {
		if err := srv.stop(); err != nil {
			logf(logDir, "unlisting the server process: "+err.Error())
		}
	}()
	logf(logDir, "Starting control daemon")
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sigs; ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			os.Remove(sock)
			return nil
		}
		if quit := handle(conn, &st, srv, logDir); quit {
			ln.Close()
			os.Remove(sock)
			logf(logDir, "Exit")
			return nil
		}
	}
}

// server is the stand-in MPS server: the daemon's own PID, listed on the fake GPU once it
// runs (no process file: no server to list).
type server struct {
	file    string
	pid     int
	running bool
}

func (s *server) start() error {
	if s.running || s.file == "" {
		return nil
	}
	if err := listProcess(s.file, s.pid, true); err != nil {
		return err
	}
	s.running = true
	return nil
}

func (s *server) stop() error {
	if !s.running {
		return nil
	}
	s.running = false
	return listProcess(s.file, s.pid, false)
}

func handle(conn net.Conn, st *State, srv *server, logDir string) (quit bool) {
	defer conn.Close()
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		logf(logDir, "CMD "+line)
		f := strings.Fields(line)
		reply := ""
		switch {
		case f[0] == "quit":
			quit = true
		case f[0] == "get_server_list":
			if srv.running {
				reply = strconv.Itoa(st.PID)
			}
		case f[0] == "get_server_status" && len(f) == 2:
			switch _, err := os.Stat(filepath.Join(logDir, FaultFile)); {
			case f[1] != strconv.Itoa(st.PID) || !srv.running:
				reply = "Unrecognized command: no server with PID " + f[1]
			case err == nil:
				reply = "FAULT"
			default:
				reply = "ACTIVE"
			}
		case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
			st.DefaultActiveThreadPercentage = f[1]
			reply = f[1]
			if err := srv.start(); err != nil {
				reply = err.Error()
			}
		case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
			st.DefaultPinnedMemLimit[f[1]] = f[2]
			if err := srv.start(); err != nil {
				reply = err.Error()
			}
		default:
			reply = "Unrecognized command: " + line
		}
		if err := st.save(logDir); err != nil {
			reply = err.Error()
		}
		fmt.Fprintln(conn, reply)
	}
	return quit
}

func client(sock string, stdin io.Reader, stdout, stderr io.Writer) int {
	conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		fmt.Fprintln(stderr, "Cannot find MPS control daemon process")
		return 1
	}
	defer conn.Close()
	if _, err := io.Copy(conn, stdin); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := conn.CloseWrite(); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	out, _ := io.ReadAll(conn)
	text := strings.TrimSpace(string(out))
	if text != "" {
		fmt.Fprintln(stdout, text)
	}
	if strings.Contains(text, "Unrecognized command") {
		return 1
	}
	return 0
}

func (s *State) save(logDir string) error {
	raw, _ := json.Marshal(s)
	tmp := filepath.Join(logDir, StateFile+".tmp")
	if err := os.WriteFile(tmp, raw, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(logDir, StateFile))
}

func logf(logDir, msg string) {
	f, err := os.OpenFile(filepath.Join(logDir, "control.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "[%s] %s\n", time.Now().UTC().Format(time.RFC3339Nano), msg)
}

// listProcess adds pid to the fake GPU's process file, or takes it off. The file is replaced
// whole, so that a reader never sees half a line.
func listProcess(file string, pid int, add bool) error {
	raw, err := os.ReadFile(file)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	lines := slices.DeleteFunc(strings.Fields(string(raw)), func(l string) bool { return l == strconv.Itoa(pid) })
	if add {
		lines = append(lines, strconv.Itoa(pid))
	}
	tmp := fmt.Sprintf("%s.%d.tmp", file, pid)
	if err := os.WriteFile(tmp, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
