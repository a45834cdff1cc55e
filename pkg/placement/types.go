package placement

// DefaultGPUCapacity is the capacity of a GPU whose spec leaves it unset:
// 1000 milli-GPU, one whole GPU.
const DefaultGPUCapacity = 1000

// GPUSpec describes one GPU of a node.
type GPUSpec struct {
	Model    string
	Capacity int64 // share units; 0 means DefaultGPUCapacity
	// Where the GPU sits on its node, nearest first; "" where unknown. GPUs of one
	// node with equal values talk faster to each other: one NVLink island, one PCIe
	// root complex, one NUMA node. fgpu's policy, Spread and Pack place a request's
	// GPUs inside one where they can (topology.go).
	Island, PCIeRoot, NUMA string
}

// NodeSpec describes a node's allocatable resources.
type NodeSpec struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	GPUs      []GPUSpec
}

// Request is one pending claim (or pod).
type Request struct {
	Name      string
	CPUMilli  int64
	MemoryMiB int64
	// GPUs is the number of GPUs wanted, all on one node.
	GPUs int
	// Share is the amount taken from each of those GPUs, in the GPUs'
	// capacity units. 0 (or a value >= the GPU's capacity) asks for whole,
	// exclusive GPUs.
	Share int64
	// Models lists the GPU models allowed; empty allows any.
	Models []string
	// Filter, when set, is asked about every (node, GPU) pair before it is
	// considered, so a controller can add policy constraints (taints,
	// topology, tenancy) without changing this package. gpu is -1 for a
	// request that needs no GPU.
	Filter func(node, gpu int) bool
	// Together, when set, gives each (node, GPU) a group, and the request's GPUs all
	// come from one group (a DRA matchAttribute constraint); a GPU in group -1 is not
	// used. Apart is the same for GPUs that must all come from different groups
	// (distinctAttribute). Every policy keeps them; a request no node with room can
	// meet them for fails with ReasonConstraint.
	Together, Apart func(node, gpu int) int
}

// Whole reports whether the request takes whole GPUs rather than a share.
func (r *Request) Whole() bool { return r.Share <= 0 }

// GPUDemand is the request's GPU amount in milli-GPU of a DefaultGPUCapacity
// GPU (for reporting only).
func (r *Request) GPUDemand() int64 {
	if r.GPUs == 0 {
		return 0
	}
	if r.Whole() || r.Share >= DefaultGPUCapacity {
		return int64(r.GPUs) * DefaultGPUCapacity
	}
	return int64(r.GPUs) * r.Share
}

// Placement is where a request was put. GPUs holds node-local GPU indices;
// Share is the amount taken from each of them (the whole capacity for
// exclusive GPUs).
type Placement struct {
	Node     int
	NodeName string
	GPUs     []int
	Share    []int64
}
