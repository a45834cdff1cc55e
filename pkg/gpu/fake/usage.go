package fake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

var _ gpu.UsageSource = (*Backend)(nil)

// ErrOutOfMemory is what a replaying workload gets when it asks for more than its cap, as a
// real MPS client's allocation fails past CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.
var ErrOutOfMemory = errors.New("CUDA error: out of memory (the fake GPU's MPS memory limit)")

// UsageFile lists what the compute processes of a fake GPU use, one "PID MEMORY_BYTES
// SM_PERCENT" line per process (SM_PERCENT -1: no sample), as NVML would measure them.
func UsageFile(devDir string, index int) string {
	return filepath.Join(devDir, fmt.Sprintf("nvidia%d.usage", index))
}

// ProcessUsage implements gpu.UsageSource: the live processes of the GPU's UsageFile. As
// with ComputeProcesses, a process that exited is not listed, whatever the file says.
func (b *Backend) ProcessUsage(uuid string) ([]gpu.ProcessUsage, error) {
	d, err := b.device(uuid)
	if err != nil {
		return nil, err
	}
	all, err := readUsage(UsageFile(b.devDir, d.Index))
	if err != nil {
		return nil, err
	}
	var out []gpu.ProcessUsage
	for _, u := range all {
		if alive(u.PID) {
			out = append(out, u)
		}
	}
	return out, nil
}

func readUsage(file string) ([]gpu.ProcessUsage, error) {
	raw, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read fake GPU usage: %w", err)
	}
	var out []gpu.ProcessUsage
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		u, err := parseUsage(f)
		if err != nil {
			return nil, fmt.Errorf("fake GPU usage file %s: line %q: %w", file, line, err)
		}
		out = append(out, u)
	}
	return out, nil
}

func parseUsage(f []string) (gpu.ProcessUsage, error) {
	if len(f) != 3 {
		return gpu.ProcessUsage{}, errors.New("want PID MEMORY_BYTES SM_PERCENT")
	}
	pid, err1 := strconv.Atoi(f[0])
	mem, err2 := strconv.ParseInt(f[1], 10, 64)
	sm, err3 := strconv.Atoi(f[2])
	if err := errors.Join(err1, err2, err3); err != nil {
		return gpu.ProcessUsage{}, err
	}
	if pid <= 0 || mem < 0 || sm < -1 || sm > 100 {
		return gpu.ProcessUsage{}, errors.New("out of range")
	}
	return gpu.ProcessUsage{PID: pid, MemoryBytes: mem, SMPercent: sm}, nil
}

// ReportUsage sets what process pid uses of fake GPU index, replacing its earlier line (a
// memory of 0 and SM of -1 removes it). capBytes > 0 is the process's MPS memory limit:
// asking for more fails with ErrOutOfMemory and leaves the earlier line, as a failed
// allocation leaves what a real process held. Writers on one GPU are serialised by a lock
// on the file, so that several replaying processes may share it. Only root may write it (the
// replaying workloads run as root): what it says sizes claims, as NVML's readings would.
func ReportUsage(devDir string, index, pid int, memoryBytes int64, smPercent int, capBytes int64) error {
	if capBytes > 0 && memoryBytes > capBytes {
		return fmt.Errorf("%w: %d bytes asked, %d allowed", ErrOutOfMemory, memoryBytes, capBytes)
	}
	if _, err := parseUsage([]string{strconv.Itoa(pid), strconv.FormatInt(memoryBytes, 10), strconv.Itoa(smPercent)}); err != nil {
		return fmt.Errorf("fake GPU usage of process %d: %w", pid, err)
	}
	file := UsageFile(devDir, index)
	lock, err := os.OpenFile(file+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("lock fake GPU usage: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("lock fake GPU usage: %w", err)
	}
	all, err := readUsage(file)
	if err != nil {
		return err
	}
	var b strings.Builder
	for _, u := range all {
		if u.PID != pid {
			fmt.Fprintf(&b, "%d %d %d\n", u.PID, u.MemoryBytes, u.SMPercent)
		}
	}
	if memoryBytes > 0 || smPercent >= 0 {
		fmt.Fprintf(&b, "%d %d %d\n", pid, memoryBytes, smPercent)
	}
	// Written aside and renamed, so that the plugin never reads half a file.
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write fake GPU usage: %w", err)
	}
	if err := os.Rename(tmp, file); err != nil {
		return fmt.Errorf("write fake GPU usage: %w", err)
	}
	return nil
}
