//go:build cgo

package nvml

import (
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// Backend discovers and configures GPUs through NVML. It owns one NVML
// initialisation: New/Open call Init, Close calls Shutdown once.
type Backend struct {
	lib  gonvml.Interface
	opts options

	// mu is held for reading by every NVML query and for writing by Close,
	// so Shutdown never runs under a query.
	mu     sync.RWMutex
	closed bool

	// fmu guards the health watch's state: the GPUs Devices found, whether the event
	// watch runs, and the faults its events latched by GPU UUID.
	fmu      sync.Mutex
	uuids    []string
	watching bool
	latched  map[string][]gpu.Fault

	// umu guards lastSample: per GPU UUID, the timestamp of the newest utilization sample
	// ProcessUsage has read, so that each call averages only the samples since the last one.
	umu        sync.Mutex
	lastSample map[string]uint64

	// topo reads where each GPU sits, for Devices.
	topo *topologyReader
}

var (
	_ gpu.Backend     = (*Backend)(nil)
	_ gpu.UsageSource = (*Backend)(nil)
)

// Open loads the host's NVML library (libnvidia-ml.so.1, or WithLibraryPath)
// and initialises it. When the library is missing the error wraps ErrNotAvailable.
func Open(opts ...Option) (gpu.Backend, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	var libOpts []gonvml.LibraryOption
	if o.libraryPath != "" {
		libOpts = append(libOpts, gonvml.WithLibraryPath(o.libraryPath))
	}
	b, err := New(gonvml.New(libOpts...), opts...)
	if err != nil && o.libraryPath != "" {
		return nil, fmt.Errorf("load NVML from %s: %w", o.libraryPath, err)
	}
	if err != nil {
		return nil, err
	}
	return b, nil
}

// New initialises lib (any go-nvml Interface: the real library or a mock such
// as go-nvml's mock/dgxh100) and returns a backend over it.
func New(lib gonvml.Interface, opts ...Option) (*Backend, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if ret := lib.Init(); ret != gonvml.SUCCESS {
		switch ret {
		case gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED:
			return nil, fmt.Errorf("%w (nvml Init: %w)", ErrNotAvailable, ret)
		}
		return nil, fmt.Errorf("nvml Init: %w", ret)
	}
	return &Backend{lib: lib, opts: o, latched: map[string][]gpu.Fault{},
		topo: &topologyReader{sysfsRoot: o.sysfsRoot, logger: o.logger}}, nil
}

var errClosed = errors.New("nvml backend is closed")

// Devices lists the node's GPUs ordered by NVML index.
func (b *Backend) Devices() ([]gpu.Device, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, errClosed
	}

	driver, ret := b.lib.SystemGetDriverVersion()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml SystemGetDriverVersion: %w", ret)
	}
	cudaVersion, ret := b.lib.SystemGetCudaDriverVersion()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml SystemGetCudaDriverVersion: %w", ret)
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml DeviceGetCount: %w", ret)
	}

	numaSupported := b.lib.Extensions().LookupSymbol("nvmlDeviceGetNumaNodeId") == nil

	devices := make([]gpu.Device, 0, count)
	handles := make([]gonvml.Device, 0, count)
	for i := 0; i < count; i++ {
		h, ret := b.lib.DeviceGetHandleByIndex(i)
		if ret != gonvml.SUCCESS {
			return nil, fmt.Errorf("nvml DeviceGetHandleByIndex on GPU %d: %w", i, ret)
		}
		d, err := b.device(i, h, numaSupported)
		if err != nil {
			return nil, err
		}
		d.DriverVersion = driver
		d.CUDADriverVersion = formatCUDAVersion(cudaVersion)
		devices = append(devices, d)
		handles = append(handles, h)
	}
	b.topo.fill(devices, handles)
	b.fmu.Lock()
	b.uuids = b.uuids[:0]
	for _, d := range devices {
		b.uuids = append(b.uuids, d.UUID)
	}
	b.fmu.Unlock()
	return devices, nil
}

// device queries the GPU at index i, whose handle is h; every failure names the call and
// index. Where the GPU sits is the topology reader's.
func (b *Backend) device(i int, h gonvml.Device, numaSupported bool) (gpu.Device, error) {
	fail := func(call string, ret gonvml.Return) error {
		return fmt.Errorf("nvml %s on GPU %d: %w", call, i, ret)
	}
	d := gpu.Device{Index: i}

	var ret gonvml.Return
	if d.UUID, ret = h.GetUUID(); ret != gonvml.SUCCESS {
		return d, fail("GetUUID", ret)
	}
	if d.ProductName, ret = h.GetName(); ret != gonvml.SUCCESS {
		return d, fail("GetName", ret)
	}

	arch, ret := h.GetArchitecture()
	switch ret {
	case gonvml.SUCCESS:
		d.Architecture = architectureName(arch)
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		d.Architecture = architectureName(gonvml.DEVICE_ARCH_UNKNOWN)
	default:
		return d, fail("GetArchitecture", ret)
	}

	major, minor, ret := h.GetCudaComputeCapability()
	if ret != gonvml.SUCCESS {
		return d, fail("GetCudaComputeCapability", ret)
	}
	d.CUDAComputeCapability = fmt.Sprintf("%d.%d", major, minor)

	mem, ret := h.GetMemoryInfo()
	if ret != gonvml.SUCCESS {
		return d, fail("GetMemoryInfo", ret)
	}
	d.MemoryBytes = int64(mem.Total)

	if d.Minor, ret = h.GetMinorNumber(); ret != gonvml.SUCCESS {
		return d, fail("GetMinorNumber", ret)
	}

	pci, ret := h.GetPciInfo()
	if ret != gonvml.SUCCESS {
		return d, fail("GetPciInfo", ret)
	}
	busID, err := pciBusID(pci)
	if err != nil {
		return d, fmt.Errorf("nvml GetPciInfo on GPU %d: %w", i, err)
	}
	d.PCIBusID = busID

	d.NUMANode = -1
	if numaSupported {
		node, ret := h.GetNumaNodeId()
		switch ret {
		case gonvml.SUCCESS:
			d.NUMANode = node
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		default:
			return d, fail("GetNumaNodeId", ret)
		}
	}

	mode, ret := h.GetComputeMode()
	if ret != gonvml.SUCCESS {
		return d, fail("GetComputeMode", ret)
	}
	d.ComputeMode = computeModeName(mode)

	d.DeviceNodes = b.deviceNodes(d.Minor)
	return d, nil
}

// deviceNodes lists the GPU's own node and the shared control nodes that exist.
func (b *Backend) deviceNodes(minor int) []string {
	names := []string{
		"nvidia" + strconv.Itoa(minor),
		"nvidiactl",
		"nvidia-uvm",
		"nvidia-uvm-tools",
	}
	nodes := make([]string, 0, len(names))
	for _, n := range names {
		p := filepath.Join(b.opts.devRoot, n)
		if b.opts.pathExists(p) {
			nodes = append(nodes, p)
		}
	}
	return nodes
}

// SetComputeMode switches the GPU with the given UUID to mode.
func (b *Backend) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	var m gonvml.ComputeMode
	switch mode {
	case gpu.ComputeModeDefault:
		m = gonvml.COMPUTEMODE_DEFAULT
	case gpu.ComputeModeExclusiveProcess:
		m = gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS
	case gpu.ComputeModeProhibited:
		m = gonvml.COMPUTEMODE_PROHIBITED
	default:
		return fmt.Errorf("set compute mode of GPU %s: unsupported compute mode %q", uuid, mode)
	}

	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return errClosed
	}
	h, ret := b.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml DeviceGetHandleByUUID for GPU %s: %w", uuid, ret)
	}
	gpuName := uuid
	if idx, ret := h.GetIndex(); ret == gonvml.SUCCESS {
		gpuName = fmt.Sprintf("%d (%s)", idx, uuid)
	}
	if ret := h.SetComputeMode(m); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml SetComputeMode(%s) on GPU %s: %w", mode, gpuName, ret)
	}
	return nil
}

// processes is the GPU's handle and its compute processes: those with a CUDA context of their
// own and the MPS clients, which NVML lists apart (a driver without the MPS listing reports
// only the former). Caller holds b.mu.
func (b *Backend) processes(uuid string) (gonvml.Device, []gonvml.ProcessInfo, error) {
	h, ret := b.lib.DeviceGetHandleByUUID(uuid)
	if ret != gonvml.SUCCESS {
		return nil, nil, fmt.Errorf("nvml DeviceGetHandleByUUID for GPU %s: %w", uuid, ret)
	}
	procs, ret := h.GetComputeRunningProcesses()
	if ret != gonvml.SUCCESS {
		return nil, nil, fmt.Errorf("nvml GetComputeRunningProcesses on GPU %s: %w", uuid, ret)
	}
	mpsProcs, ret := h.GetMPSComputeRunningProcesses()
	switch ret {
	case gonvml.SUCCESS:
		procs = append(procs, mpsProcs...)
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
	default:
		return nil, nil, fmt.Errorf("nvml GetMPSComputeRunningProcesses on GPU %s: %w", uuid, ret)
	}
	return h, procs, nil
}

// ComputeProcesses lists the PIDs of the compute processes on the GPU with the given UUID:
// those with a CUDA context of their own (an MPS server among them) and the MPS clients,
// which NVML lists apart. A driver without the MPS listing reports only the former. The
// driver translates the PIDs into the caller's PID namespace and drops the processes
// outside it: from a pod without hostPID only the pod's own processes are listed.
func (b *Backend) ComputeProcesses(uuid string) ([]int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, errClosed
	}
	_, procs, err := b.processes(uuid)
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, p := range procs {
		if !slices.Contains(pids, int(p.Pid)) {
			pids = append(pids, int(p.Pid))
		}
	}
	return pids, nil
}

// ProcessUsage lists the GPU's compute processes (as ComputeProcesses) with the memory NVML
// counts for each and the mean of the SM utilization samples the driver took of each since
// the previous call (GetProcessUtilization; -1 for a process with no sample in that span,
// and for all of them where the driver does not sample per process).
func (b *Backend) ProcessUsage(uuid string) ([]gpu.ProcessUsage, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed {
		return nil, errClosed
	}
	h, procs, err := b.processes(uuid)
	if err != nil {
		return nil, err
	}
	sm, err := b.smSamples(h, uuid)
	if err != nil {
		return nil, err
	}
	var out []gpu.ProcessUsage
	for _, p := range procs {
		if slices.ContainsFunc(out, func(u gpu.ProcessUsage) bool { return u.PID == int(p.Pid) }) {
			continue
		}
		u := gpu.ProcessUsage{PID: int(p.Pid), MemoryBytes: int64(p.UsedGpuMemory), SMPercent: -1}
		if s, ok := sm[p.Pid]; ok {
			u.SMPercent = s
		}
		out = append(out, u)
	}
	return out, nil
}

// smSamples averages the driver's per-process SM utilization samples taken since the last
// call for this GPU.
func (b *Backend) smSamples(h gonvml.Device, uuid string) (map[uint32]int, error) {
	b.umu.Lock()
	defer b.umu.Unlock()
	samples, ret := h.GetProcessUtilization(b.lastSample[uuid])
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_NOT_FOUND, gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
		return nil, nil // no sample since the last call, or none per process on this GPU
	default:
		return nil, fmt.Errorf("nvml GetProcessUtilization on GPU %s: %w", uuid, ret)
	}
	sum, n := map[uint32]int{}, map[uint32]int{}
	for _, s := range samples {
		sum[s.Pid] += int(min(s.SmUtil, 100))
		n[s.Pid]++
		if s.TimeStamp > b.lastSample[uuid] {
			if b.lastSample == nil {
				b.lastSample = map[string]uint64{}
			}
			b.lastSample[uuid] = s.TimeStamp
		}
	}
	for pid := range sum {
		sum[pid] /= n[pid]
	}
	return sum, nil
}

// MPSControlBinary is the configured nvidia-cuda-mps-control.
func (b *Backend) MPSControlBinary() string { return b.opts.mpsControl }

// Close shuts NVML down. Only the first call does so; later calls return nil.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if ret := b.lib.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("nvml Shutdown: %w", ret)
	}
	return nil
}

// architectureName maps NVML's architecture codes to marketing names.
func architectureName(arch gonvml.DeviceArchitecture) string {
	switch arch {
	case gonvml.DEVICE_ARCH_KEPLER:
		return "Kepler"
	case gonvml.DEVICE_ARCH_MAXWELL:
		return "Maxwell"
	case gonvml.DEVICE_ARCH_PASCAL:
		return "Pascal"
	case gonvml.DEVICE_ARCH_VOLTA:
		return "Volta"
	case gonvml.DEVICE_ARCH_TURING:
		return "Turing"
	case gonvml.DEVICE_ARCH_AMPERE:
		return "Ampere"
	case gonvml.DEVICE_ARCH_ADA:
		return "Ada Lovelace"
	case gonvml.DEVICE_ARCH_HOPPER:
		return "Hopper"
	case gonvml.DEVICE_ARCH_BLACKWELL:
		return "Blackwell"
	case gonvml.DEVICE_ARCH_RUBIN:
		return "Rubin"
	}
	return "Unknown"
}

// computeModeName maps NVML's compute modes to gpu.ComputeMode. The deprecated
// exclusive-thread mode and unknown codes have no gpu constant and are named as is.
func computeModeName(m gonvml.ComputeMode) gpu.ComputeMode {
	switch m {
	case gonvml.COMPUTEMODE_DEFAULT:
		return gpu.ComputeModeDefault
	case gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS:
		return gpu.ComputeModeExclusiveProcess
	case gonvml.COMPUTEMODE_PROHIBITED:
		return gpu.ComputeModeProhibited
	case gonvml.COMPUTEMODE_EXCLUSIVE_THREAD:
		return gpu.ComputeMode("ExclusiveThread")
	}
	return gpu.ComputeMode(fmt.Sprintf("Unknown(%d)", m))
}

// formatCUDAVersion turns NVML's 12080 into "12.8".
func formatCUDAVersion(v int) string {
	return fmt.Sprintf("%d.%d", v/1000, v%1000/10)
}

// pciBusID reads the bus id NVML reports ("00000000:3B:00.0") and returns it
// in the kernel's sysfs form ("0000:3b:00.0").
func pciBusID(p gonvml.PciInfo) (string, error) {
	id := cString(p.BusId[:])
	if id == "" {
		id = cString(p.BusIdLegacy[:])
	}
	return normalizePCIBusID(id)
}

func normalizePCIBusID(id string) (string, error) {
	parts := strings.Split(strings.TrimSpace(id), ":")
	if len(parts) == 2 { // bus:dev.fn, domain 0
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", fmt.Errorf("malformed PCI bus id %q", id)
	}
	devFn := strings.Split(parts[2], ".")
	if len(devFn) != 2 {
		return "", fmt.Errorf("malformed PCI bus id %q", id)
	}
	var n [4]uint64
	for i, s := range []string{parts[0], parts[1], devFn[0], devFn[1]} {
		v, err := strconv.ParseUint(s, 16, 32)
		if err != nil || s == "" {
			return "", fmt.Errorf("malformed PCI bus id %q", id)
		}
		n[i] = v
	}
	if n[1] > 0xff || n[2] > 0x1f || n[3] > 7 {
		return "", fmt.Errorf("malformed PCI bus id %q", id)
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", n[0], n[1], n[2], n[3]), nil
}

func cString(b []int8) string {
	var sb strings.Builder
	for _, c := range b {
		if c == 0 {
			break
		}
		sb.WriteByte(byte(c))
	}
	return sb.String()
}
