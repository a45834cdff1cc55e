package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
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
		if err != nil || !strings.Contains(string(env), "FGPU_FAKE_MPS_DAEMON=1") {
			continue
		}
		for _, kv := range strings.Split(string(env), "\x00") {
			if dir, ok := strings.CutPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY="); ok {
				s.Daemons[dir] = append(s.Daemons[dir], pid)
			}
		}
	}
	cp, err := checkpoint.NewStore(CheckpointPath).Load()
	if err != nil {
		return s, err
	}
	s.Checkpoint = cp
	return s, nil
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
