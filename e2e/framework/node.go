package framework

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// NodeState is what the plugin holds on the node, read from the host.
type NodeState struct {
	// SpecClaims are the claim UIDs that have a CDI spec.
	SpecClaims []string
	// MPSDirs are the per-daemon directories under the state dir.
	MPSDirs []string
	// Daemons are the live MPS control daemon processes, by their pipe directory.
	Daemons map[string][]int
	// Checkpoint is the plugin's checkpoint.
	Checkpoint *checkpoint.Checkpoint
	// Spares are the keys of the spare MPS daemons no claim took: the plugin keeps one on
	// each GPU, and MPSDirs and Daemons leave them out.
	Spares []string
	// ReadySpares are those of Spares that answer: a domain's first claim takes only these.
	ReadySpares []string
}

// ReadNodeState inspects the host as root.
func ReadNodeState() (NodeState, error) {
	s := NodeState{Daemons: map[string][]int{}}
	specs, _ := filepath.Glob(filepath.Join(CDIDir, "fgpu.dev-gpu_*"))
	for _, p := range specs {
		name := strings.TrimPrefix(filepath.Base(p), "fgpu.dev-gpu_")
		s.SpecClaims = append(s.SpecClaims, strings.TrimSuffix(strings.TrimSuffix(name, ".yaml"), ".json"))
	}
	dirs, _ := os.ReadDir(filepath.Join(StateDir, "mps"))
	for _, d := range dirs {
		s.MPSDirs = append(s.MPSDirs, d.Name())
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || !alive(pid) {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", p.Name(), "environ"))
		if err != nil || !isStandInDaemon(p.Name(), string(env)) {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			// Unit tests on this machine run stand-ins of their own, elsewhere.
			if dir, ok := strings.CutPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY="); ok && strings.HasPrefix(dir, StateDir+"/") {
				s.Daemons[dir] = append(s.Daemons[dir], pid)
			}
		}
	}
	cp, err := checkpoint.NewStore(CheckpointPath).Load()
	if err != nil {
		return s, err
	}
	s.Checkpoint = cp
	s.MPSDirs = slices.DeleteFunc(s.MPSDirs, func(key string) bool {
		if IdleSpare(cp, key) {
			s.Spares = append(s.Spares, key)
			if b, err := os.ReadFile(filepath.Join(StateDir, "mps", key, mps.SpareMarker)); err == nil && string(b) == mps.SpareReady {
				s.ReadySpares = append(s.ReadySpares, key)
			}
			return true
		}
		return false
	})
	maps.DeleteFunc(s.Daemons, func(pipe string, _ []int) bool { return IdleSpare(cp, filepath.Base(filepath.Dir(pipe))) })
	// The plugin keeps one spare per GPU: a second marked one on a GPU is a spare it lost
	// (a stop that failed), which the filter above would hide.
	perGPU := map[string]int{}
	for _, key := range s.Spares {
		gpu, _, _ := strings.Cut(strings.TrimPrefix(key, mps.SparePrefix), "_")
		if perGPU[gpu]++; perGPU[gpu] > 1 {
			return s, fmt.Errorf("more than one idle spare MPS daemon on %s: %v", gpu, s.Spares)
		}
	}
	return s, nil
}

// IdleSpare says whether daemon key is a spare that no domain took: the plugin marks it so
// until a claim takes it, and no claim in cp names it. A daemon a claim took keeps its key,
// but not the mark: left after its claims, it is a leak.
func IdleSpare(cp *checkpoint.Checkpoint, key string) bool {
	if !strings.HasPrefix(key, mps.SparePrefix) {
		return false
	}
	if _, err := os.Stat(filepath.Join(StateDir, "mps", key, mps.SpareMarker)); err != nil {
		return false
	}
	for _, e := range cp.Claims {
		for _, d := range e.Devices {
			if d.MPSKey == key {
				return false
			}
		}
	}
	return true
}

// isStandInDaemon: the stand-in MPS daemon, detached (-d, the plugin's child outside
// Kubernetes) or in the foreground of its pod (-f).
func isStandInDaemon(pid, env string) bool {
	if strings.Contains(env, "FGPU_FAKE_MPS_DAEMON=1") {
		return true
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
	return err == nil && strings.HasSuffix(string(cmdline), "fake-mps-control\x00-f\x00")
}

// alive is false for exited processes, zombies included.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	i := strings.LastIndexByte(string(stat), ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z' && stat[i+2] != 'X'
}

// PluginPIDs returns the host PIDs of running fgpu-kubelet-plugin processes.
func PluginPIDs() []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || !alive(pid) {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(string(cmdline), "/usr/bin/fgpu-kubelet-plugin\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

// KillPlugin SIGKILLs every plugin process.
func KillPlugin() (int, error) {
	pids := PluginPIDs()
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			return 0, err
		}
	}
	return len(pids), nil
}

// MountsUnder lists the host's mount points at or below dir (the MPS servers' shm tmpfs).
func MountsUnder(dir string) []string {
	// mountinfo names the real path (/var/run is a link to /run).
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	raw, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// ContainerdSocket is the local cluster's containerd.
func ContainerdSocket() string {
	return filepath.Join(RepoRoot(), "_output", "cluster", "containerd", "containerd.sock")
}

// PluginRegistrations counts the kubelet's connections to a (re)started fgpu plugin, from the
// local cluster's kubelet log: a plugin pod is Ready before the kubelet has registered it,
// and a claim prepared in between waits for the kubelet's retry (a minute or more).
func PluginRegistrations() int {
	raw, _ := os.ReadFile(filepath.Join(RepoRoot(), "_output", "cluster", "logs", "kubelet.log"))
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, `"Connection changed"`) && strings.Contains(l, `driverName="`+Driver+`"`) && strings.Contains(l, "connected=true") {
			n++
		}
	}
	return n
}
