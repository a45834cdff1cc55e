// Package fake is a GPU backend that needs no GPU: a deterministic fleet described by a flag
// or a small YAML file, with real device node files so CDI specs that name them apply, wired
// (PCIe roots, NUMA nodes, NVLink islands) as a topology preset says (topology.go).
//
// Beside each device node nvidiaN it keeps the state a real GPU keeps across restarts of
// whoever drives it: nvidiaN.compute-mode holds the GPU's compute mode, and nvidiaN.processes
// the PIDs of the compute processes on it, one per line, as NVML would list them. A test
// puts a process "on" a GPU that fgpu did not start by writing its PID there (ProcessFile)
// and takes it off by removing the line or the file. nvidiaN.usage (UsageFile) says what
// processes use of the GPU, as NVML measures it: written by tests, or by a workload that
// replays recorded usage (ReportUsage).
package fake

import (
	"crypto/sha1"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// Model is a GPU product the fake backend can pretend to be.
type Model struct {
	ProductName           string
	Architecture          string
	CUDAComputeCapability string
	MemoryBytes           int64
}

const gib = int64(1) << 30

// Models are the fake products by the short names used in specs such as 4xH100-80GB.
var Models = map[string]Model{
	"H100-80GB":  {"NVIDIA H100 80GB HBM3", "Hopper", "9.0", 80 * gib},
	"H200-141GB": {"NVIDIA H200", "Hopper", "9.0", 141 * gib},
	"A100-40GB":  {"NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40 * gib},
	"A100-80GB":  {"NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 80 * gib},
	"L4-24GB":    {"NVIDIA L4", "Ada Lovelace", "8.9", 24 * gib},
	"T4-16GB":    {"Tesla T4", "Turing", "7.5", 16 * gib},
}

// Fleet is the YAML form of a fake node's GPUs.
type Fleet struct {
	// GPUs lists the node's GPUs in index order.
	GPUs []FleetGPU `json:"gpus"`
	// Topology is how they are wired: a preset such as nvlink-2x4 (topology.go); none puts
	// them all under one PCIe root.
	Topology string `json:"topology,omitempty"`
}

// FleetGPU is one entry of a Fleet: a model name, optionally repeated.
type FleetGPU struct {
	Model string `json:"model"`
	Count int    `json:"count,omitempty"`
}

const (
	driverVersion     = "580.65.06"
	cudaDriverVersion = "13.0"
	// nullMajor/nullMinor make the fake device nodes behave like /dev/null inside containers.
	nullMajor, nullMinor = 1, 3
)

// Backend is the fake GPU backend.
type Backend struct {
	devices []gpu.Device
	devDir  string
	mpsBin  string

	// mu serialises compute mode changes, as the driver does.
	mu sync.Mutex
}

var specRE = regexp.MustCompile(`^(\d+)x([A-Za-z0-9-]+)$`)

// ParseSpec parses "4xH100-80GB" or "2xH100-80GB,1xA100-40GB" into a fleet, and a topology
// preset after a slash: "8xH100-80GB/nvlink-2x4".
func ParseSpec(spec string) (Fleet, error) {
	var f Fleet
	gpus, topo, slash := strings.Cut(spec, "/")
	n := 0
	for _, part := range strings.Split(gpus, ",") {
		m := specRE.FindStringSubmatch(strings.TrimSpace(part))
		if m == nil {
			return Fleet{}, fmt.Errorf("fake GPU spec %q: want <count>x<model>, e.g. 4xH100-80GB", part)
		}
		count, _ := strconv.Atoi(m[1])
		f.GPUs = append(f.GPUs, FleetGPU{Model: m[2], Count: count})
		n += max(count, 1)
	}
	if slash {
		if topo == "" {
			return Fleet{}, fmt.Errorf("fake GPU spec %q: no topology after the slash, e.g. 8xH100-80GB/nvlink-2x4", spec)
		}
		// Checked here too, so that a malformed flag fails as one.
		if _, err := parseTopology(topo, n); err != nil {
			return Fleet{}, fmt.Errorf("fake GPU spec %q: %w", spec, err)
		}
		f.Topology = topo
	}
	return f, nil
}

// LoadFleetFile reads a YAML fleet description.
func LoadFleetFile(path string) (Fleet, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return Fleet{}, fmt.Errorf("read fake GPU fleet: %w", err)
	}
	var f Fleet
	if err := yaml.UnmarshalStrict(raw, &f); err != nil {
		return Fleet{}, fmt.Errorf("parse fake GPU fleet %s: %w", path, err)
	}
	return f, nil
}

// New builds the fleet for one node. The node name seeds the UUIDs so that every node of
// a fake cluster has distinct, stable GPUs. devDir receives the fake device nodes.
func New(f Fleet, nodeName, devDir, mpsControlBinary string) (*Backend, error) {
	b := &Backend{devDir: devDir, mpsBin: mpsControlBinary}
	if err := os.MkdirAll(devDir, 0o755); err != nil {
		return nil, fmt.Errorf("create fake device directory: %w", err)
	}
	shared := []string{filepath.Join(devDir, "nvidiactl"), filepath.Join(devDir, "nvidia-uvm")}
	for _, p := range shared {
		if err := ensureDeviceNode(p); err != nil {
			return nil, err
		}
	}
	total := 0
	for _, g := range f.GPUs {
		if _, ok := Models[g.Model]; !ok {
			return nil, fmt.Errorf("unknown fake GPU model %q (known: %s)", g.Model, knownModels())
		}
		if g.Count < 0 || total+max(g.Count, 1) > 64 {
			return nil, fmt.Errorf("fake GPU count %d out of range (a node has 1-64 GPUs)", g.Count)
		}
		total += max(g.Count, 1)
	}
	if total == 0 {
		return nil, errors.New("fake GPU fleet is empty")
	}
	topo, err := parseTopology(f.Topology, total)
	if err != nil {
		return nil, err
	}
	for _, g := range f.GPUs {
		model := Models[g.Model]
		for range max(g.Count, 1) {
			idx := len(b.devices)
			node := filepath.Join(devDir, fmt.Sprintf("nvidia%d", idx))
			if err := ensureDeviceNode(node); err != nil {
				return nil, err
			}
			p := topo.place(idx)
			b.devices = append(b.devices, gpu.Device{
				Index:                 idx,
				UUID:                  fakeUUID(nodeName, idx),
				ProductName:           model.ProductName,
				Architecture:          model.Architecture,
				CUDAComputeCapability: model.CUDAComputeCapability,
				DriverVersion:         driverVersion,
				CUDADriverVersion:     cudaDriverVersion,
				MemoryBytes:           model.MemoryBytes,
				Minor:                 idx,
				PCIBusID:              p.busID,
				NUMANode:              p.numa,
				ComputeMode:           gpu.ComputeModeDefault,
				PCIeRoot:              p.root,
				NVLinkIsland:          p.island,
				FabricClique:          p.clique,
				CPUAffinity:           p.cpus,
				DeviceNodes:           append([]string{node}, shared...),
			})
		}
	}
	return b, nil
}

// Devices implements gpu.Backend.
func (b *Backend) Devices() ([]gpu.Device, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]gpu.Device, len(b.devices))
	for i, d := range b.devices {
		raw, err := os.ReadFile(b.modeFile(d.Index))
		switch {
		case err == nil:
			d.ComputeMode = gpu.ComputeMode(strings.TrimSpace(string(raw)))
		case !errors.Is(err, os.ErrNotExist):
			return nil, fmt.Errorf("read fake GPU compute mode: %w", err)
		}
		out[i] = d
	}
	return out, nil
}

// SetComputeMode implements gpu.Backend.
func (b *Backend) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, err := b.device(uuid)
	if err != nil {
		return err
	}
	if err := os.WriteFile(b.modeFile(d.Index), []byte(string(mode)+"\n"), 0o644); err != nil {
		return fmt.Errorf("set fake GPU compute mode: %w", err)
	}
	return nil
}

// ComputeProcesses implements gpu.Backend: the PIDs listed in the GPU's ProcessFile, and
// those of its stand-in MPS servers (ServerFile) and UsageFile that still run. NVML lists live processes
// only; a stand-in killed with its container cannot unlist itself, so the listing checks.
func (b *Backend) ComputeProcesses(uuid string) ([]int, error) {
	d, err := b.device(uuid)
	if err != nil {
		return nil, err
	}
	pids, err := readPIDs(ProcessFile(b.devDir, d.Index))
	if err != nil {
		return nil, err
	}
	servers, err := readPIDs(ServerFile(b.devDir, d.Index))
	if err != nil {
		return nil, err
	}
	for _, pid := range servers {
		if alive(pid) {
			pids = append(pids, pid)
		}
	}
	usage, err := readUsage(UsageFile(b.devDir, d.Index))
	if err != nil {
		return nil, err
	}
	for _, u := range usage {
		// A replaying workload killed mid-run cannot unlist itself either.
		if alive(u.PID) && !slices.Contains(pids, u.PID) {
			pids = append(pids, u.PID)
		}
	}
	return pids, nil
}

func alive(pid int) bool { return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

func readPIDs(file string) ([]int, error) {
	raw, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read fake GPU processes: %w", err)
	}
	var pids []int
	for _, f := range strings.Fields(string(raw)) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("fake GPU process file %s: %q is not a PID", file, f)
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// ProcessFile is where a fake GPU's compute processes are listed, one PID per line: what a
// test or a person writes to stand for work fgpu did not start.
func ProcessFile(devDir string, index int) string {
	return filepath.Join(devDir, fmt.Sprintf("nvidia%d.processes", index))
}

// ServerFile is where the stand-in MPS daemons of a fake GPU list themselves while they run.
func ServerFile(devDir string, index int) string {
	return filepath.Join(devDir, fmt.Sprintf("nvidia%d.mps-servers", index))
}

func (b *Backend) modeFile(index int) string {
	return filepath.Join(b.devDir, fmt.Sprintf("nvidia%d.compute-mode", index))
}

func (b *Backend) device(uuid string) (gpu.Device, error) {
	for _, d := range b.devices {
		if d.UUID == uuid {
			return d, nil
		}
	}
	return gpu.Device{}, fmt.Errorf("no fake GPU with UUID %s", uuid)
}

// MPSDaemonEnv tells the stand-in daemon started for a GPU where that GPU's server file is,
// so that it lists itself there as NVML lists a real MPS server.
func (b *Backend) MPSDaemonEnv(uuid string) []string {
	d, err := b.device(uuid)
	if err != nil {
		return nil
	}
	return []string{fakecontrol.ProcessFileEnv + "=" + ServerFile(b.devDir, d.Index)}
}

// MPSControlBinary implements gpu.Backend: the stand-in control daemon.
func (b *Backend) MPSControlBinary() string { return b.mpsBin }

// Close implements gpu.Backend.
func (b *Backend) Close() error { return nil }

func fakeUUID(nodeName string, idx int) string {
	h := sha1.Sum([]byte(fmt.Sprintf("%s/%d", nodeName, idx)))
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// ensureDeviceNode creates a character device that behaves like /dev/null, so that a CDI
// spec naming it is applied by the container runtime like a real GPU node.
func ensureDeviceNode(path string) error {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		if st.Mode&unix.S_IFMT == unix.S_IFCHR {
			return nil
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("replace non-device %s: %w", path, err)
		}
	}
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(nullMajor, nullMinor))); err != nil {
		return fmt.Errorf("create fake device node %s (needs root or CAP_MKNOD): %w", path, err)
	}
	return nil
}

func knownModels() string {
	return strings.Join(slices.Sorted(maps.Keys(Models)), ", ")
}
