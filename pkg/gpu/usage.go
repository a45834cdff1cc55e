package gpu

// ProcessUsage is what one compute process used of a GPU when it was sampled.
type ProcessUsage struct {
	PID int
	// MemoryBytes is the GPU memory the process holds (NVML's usedGpuMemory).
	MemoryBytes int64
	// SMPercent is the share of the GPU's time its SMs ran the process's kernels over the
	// last sampling period, 0-100, or -1 when the driver gave no sample for it.
	SMPercent int
}

// UsageSource measures the GPU use of each compute process, so that the plugin can size
// claims from what their processes use. Backends that can measure implement it.
type UsageSource interface {
	// ProcessUsage lists the compute processes on a GPU (those with their own context and
	// MPS clients, PIDs as ComputeProcesses gives them) with what each uses.
	ProcessUsage(uuid string) ([]ProcessUsage, error)
}
