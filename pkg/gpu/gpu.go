// Package gpu describes the GPUs of one node independently of how they were discovered,
// so that everything above it runs the same on NVML and on the fake backend.
package gpu

import "fmt"

// Device is one physical GPU as the plugin publishes it.
type Device struct {
	Index                 int
	UUID                  string
	ProductName           string
	Architecture          string
	CUDAComputeCapability string // "9.0"
	DriverVersion         string
	CUDADriverVersion     string // "12.8"
	MemoryBytes           int64  // total framebuffer memory
	Minor                 int    // /dev/nvidia<Minor>
	PCIBusID              string // "0000:3b:00.0"
	NUMANode              int    // -1 when unknown
	ComputeMode           ComputeMode
	// Where the GPU sits on its node, for claims that want GPUs that talk fast to each other;
	// each is "" where unknown (or, for the island and the clique, where the GPU has none).
	PCIeRoot     string // the PCIe root complex, "pci0000:00"
	NVLinkIsland string // the same on the node's GPUs that reach each other over NVLink: "nvl-0"
	FabricClique string // a multi-node NVLink fabric's "<cluster UUID>.<clique id>"
	CPUAffinity  string // the CPUs nearest the GPU, "0-31,64-95"
	// DeviceNodes are the host paths a container needs to use this GPU
	// (its own /dev/nvidiaN plus the control nodes shared by all GPUs).
	DeviceNodes []string
}

// ComputeMode mirrors NVML's compute modes that matter for sharing.
type ComputeMode string

const (
	ComputeModeDefault          ComputeMode = "Default"
	ComputeModeExclusiveProcess ComputeMode = "ExclusiveProcess"
	ComputeModeProhibited       ComputeMode = "Prohibited"
)

// Name is the device name used in ResourceSlices: gpu-<index>.
func (d Device) Name() string { return fmt.Sprintf("gpu-%d", d.Index) }

// Backend discovers the node's GPUs. Implementations: nvml (real GPUs, cgo) and fake.
type Backend interface {
	// Devices lists the node's GPUs ordered by index.
	Devices() ([]Device, error)
	// SetComputeMode switches a GPU's compute mode; MPS wants ExclusiveProcess.
	SetComputeMode(uuid string, mode ComputeMode) error
	// ComputeProcesses lists the PIDs of the compute processes on a GPU as NVML reports them:
	// PIDs in the caller's PID namespace, leaving out processes outside it (so the caller
	// must share the node's PID namespace to see them all). An MPS server is one such process;
	// its clients run in its context, and NVML lists them separately (MPS processes), so
	// they are included too.
	ComputeProcesses(uuid string) ([]int, error)
	// MPSControlBinary is the nvidia-cuda-mps-control (or stand-in) to run for this backend.
	MPSControlBinary() string
	// Close releases the backend (NVML shutdown).
	Close() error
}
