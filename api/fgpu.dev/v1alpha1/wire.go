package v1alpha1

import resourceapi "k8s.io/api/resource/v1"

// The wire contract between the kubelet plugin, the allocator, the Helm chart and users:
// names that the plugin publishes in ResourceSlices, that the allocator writes into
// allocations and that users put in their claims. Changing one breaks running clusters.
const (
	// DriverName is the DRA driver name: ResourceSlices, allocation results and opaque
	// configs all carry it.
	DriverName = "gpu.fgpu.dev"

	// DeviceClassShared is the DeviceClass of a share of a GPU; DeviceClassExclusive the one
	// of whole GPUs. The chart creates both.
	DeviceClassShared    = "gpu.fgpu.dev"
	DeviceClassExclusive = "exclusive.gpu.fgpu.dev"

	// CapacityMemory is a device's memory in bytes; CapacityCompute the percent of its SMs.
	CapacityMemory  resourceapi.QualifiedName = "memory"
	CapacityCompute resourceapi.QualifiedName = "compute"

	// The attributes the plugin publishes on each GPU device, which claims select on in CEL
	// (device.attributes["gpu.fgpu.dev"].productName). AttributeMemoryCap is the memory
	// enforcement an MPS share gets there (DeviceStatusData.MemoryCap).
	AttributeMemoryCap             resourceapi.QualifiedName = "memoryCap"
	AttributeUUID                  resourceapi.QualifiedName = "uuid"
	AttributeProductName           resourceapi.QualifiedName = "productName"
	AttributeArchitecture          resourceapi.QualifiedName = "architecture"
	AttributeIndex                 resourceapi.QualifiedName = "index"
	AttributeMinor                 resourceapi.QualifiedName = "minor"
	AttributeComputeMode           resourceapi.QualifiedName = "computeMode"
	AttributeCUDAComputeCapability resourceapi.QualifiedName = "cudaComputeCapability"
	AttributeDriverVersion         resourceapi.QualifiedName = "driverVersion"
	AttributeCUDADriverVersion     resourceapi.QualifiedName = "cudaDriverVersion"
	AttributeNUMANode              resourceapi.QualifiedName = "numaNode"

	// Where a GPU sits on its node, for claims that ask for GPUs that talk fast to each
	// other (matchAttribute) and for the allocator's placement. AttributePCIeRoot is the
	// Kubernetes standard name: the PCIe root complex ("pci0000:00"). AttributeNVLinkIsland
	// names the node's GPUs that reach each other over NVLink (the same value on each);
	// a GPU without NVLink peers has none. AttributeFabricClique is the NVLink fabric's
	// "<cluster UUID>.<clique id>" on GPUs that belong to one (multi-node NVLink).
	// AttributeCPUAffinity is the CPU list ("0-31,64-95") nearest the GPU.
	// AttributeNUMANodeStandard is Kubernetes' standard name for AttributeNUMANode, by which
	// a claim can match a GPU's NUMA node with other drivers' devices.
	AttributePCIeRoot         resourceapi.QualifiedName = "resource.kubernetes.io/pcieRoot"
	AttributeNUMANodeStandard resourceapi.QualifiedName = "resource.kubernetes.io/numaNode"
	AttributeNVLinkIsland     resourceapi.QualifiedName = "nvlinkIsland"
	AttributeFabricClique     resourceapi.QualifiedName = "fabricClique"
	AttributeCPUAffinity      resourceapi.QualifiedName = "cpuAffinity"

	// MemoryStep is the granularity of memory shares (the devices' requestPolicy step):
	// published memory is rounded down to it, requests up.
	MemoryStep = int64(256) << 20

	// FenceTaintKey and FenceTaintValue make the NoSchedule taint the plugin puts on its
	// devices in allocator mode: only the allocator tolerates it, so kube-scheduler never
	// allocates them itself. The chart's admission policy refuses claims that tolerate it.
	FenceTaintKey   = "fgpu.dev/allocator"
	FenceTaintValue = "required"

	// DeviceConditionPrepared is the condition the plugin sets, with status False, on a
	// claim's status.devices entry when it refuses to prepare the device for a reason that
	// placing the claim again can fix (one of the reasons below). The allocator watches
	// for it on the claims it placed, takes the allocation back and places the claim again.
	DeviceConditionPrepared = "Prepared"
	// PrepareReasonOverCommitted: the GPU holds prepared shares the allocation did not count
	// (two allocators, a lagging informer, or shares kube-scheduler placed).
	PrepareReasonOverCommitted = "OverCommitted"
	// PrepareReasonDeviceGone: the allocated device is no longer on the node.
	PrepareReasonDeviceGone = "DeviceGone"
	// PrepareReasonIsolationConflict: the share would put a second isolation domain (another
	// MPS server, or time-sliced processes) on a GPU where the claim's placement or that of a
	// share already prepared there keeps the GPU to one domain.
	PrepareReasonIsolationConflict = "IsolationConflict"
)

// Names fgpu writes on Kubernetes objects: other components, the chart's admission policies
// and operators' tooling match on them.
const (
	// FinalizerAllocator keeps a claim the allocator placed until it has released its
	// shares. It is a convenience, not what the allocator trusts: a tenant can remove it,
	// and the allocator adds it back (PlacedByAllocator says which claims are its own).
	FinalizerAllocator = "fgpu.dev/allocator"

	// AnnotationStatus on a claim says in words where it stands (ResourceClaim status has
	// no conditions). Only the allocator writes it (the chart's
	// fgpu-claims-status-by-allocator policy) and never reads it back; `fgpu why` shows it.
	AnnotationStatus = "fgpu.dev/status"
	// AnnotationReclaimed on a claim names the GPU the allocator takes back from it (a
	// namespace granted allowSharedGPU holds it beyond its quota): its pods are deleted, and
	// admission refuses new reservations of the claim (the chart's
	// fgpu-claims-reclaimed-no-new-pods policy) until it is deallocated. Only the allocator
	// writes it (fgpu-claims-status-by-allocator).
	AnnotationReclaimed = "fgpu.dev/reclaimed"
	// LabelObservedUsage marks the ConfigMaps the kubelet plugins keep their observed
	// usage in (ObservedUsage); its value is the node. ObservedUsagePrefix+<node> names
	// them, ObservedUsageKey is their data key.
	LabelObservedUsage  = "fgpu.dev/observed-usage"
	ObservedUsagePrefix = "fgpu-observed-"
	ObservedUsageKey    = "usage.json"
	// AnnotationSizingRecord carries, on each sizing recommendation event the allocator
	// records, the workload and its recommendation as JSON (SizingRecord), which
	// `fgpu recommendations` reads.
	AnnotationSizingRecord = "fgpu.dev/recommendation"

	// ForeignTaintKey marks a GPU that runs compute processes fgpu did not start; its value
	// is their number.
	ForeignTaintKey = "fgpu.dev/foreign-processes"
	// The taints of a faulty GPU; each value names the reason ("xid-79", "lost", ...).
	// FaultTaintKey (NoExecute) marks a GPU whose work cannot go on.
	FaultTaintKey = "fgpu.dev/gpu-fault"
	// DegradedTaintKey (NoSchedule) marks a GPU whose work may go on but that takes no more.
	DegradedTaintKey = "fgpu.dev/gpu-degraded"
	// FlappingTaintKey (NoSchedule) keeps a GPU that faulted too often in a short window
	// fenced for a while, also after its faults cleared (the plugin's flap settings).
	FlappingTaintKey = "fgpu.dev/gpu-flapping"

	// Labels of an MPS daemon's pod. LabelMPSDaemon holds the daemon's key: how a restarted
	// plugin knows what a pod serves; LabelMPSGPU and LabelMPSNode the GPU's UUID and the node.
	LabelMPSDaemon = "fgpu.dev/mps-daemon"
	LabelMPSGPU    = "fgpu.dev/gpu"
	LabelMPSNode   = "fgpu.dev/node"

	// CDIVendor and CDIClass make up the CDI kind fgpu.dev/gpu of the devices the plugin
	// hands the container runtime, and the names of its CDI spec files.
	CDIVendor = "fgpu.dev"
	CDIClass  = "gpu"
)

// Idle scale-down's annotations on a Deployment or StatefulSet.
const (
	// AnnotationIdleScaleDown "true" is the owner's opt-in: a policy's IdleScaleDown scales
	// only the workloads that carry it.
	AnnotationIdleScaleDown = "fgpu.dev/idle-scale-down"
	// AnnotationScaledDownReplicas is the replicas the allocator found before it scaled the
	// workload to zero: what `fgpu wake` restores.
	AnnotationScaledDownReplicas = "fgpu.dev/scaled-down-replicas"
	// AnnotationScaledDownReserve is what the workload's claims held (IdleReserve, JSON):
	// while the workload has no replicas it counts against its own namespace's quota.
	AnnotationScaledDownReserve = "fgpu.dev/scaled-down-reserve"
)

// Pods that ask for an extended resource such as nvidia.com/gpu (written for NVIDIA's device
// plugin): the chart's admission policy fgpu-extended-resource-pods rewrites a container's
// request for N of it into a claim, named ExtendedResourcePodClaimPrefix<i> in the pod
// (ExtendedResourceInitClaimPrefix<i> for init container i), from the ResourceClaimTemplate
// ExtendedResourceTemplatePrefix<N>, which the allocator keeps in the pod's namespace.
const (
	// LabelExtendedResource "true" marks the pods the policy rewrote and the templates the
	// allocator made for them; "false" on a namespace leaves its pods to whatever else
	// serves the resource.
	LabelExtendedResource           = "fgpu.dev/extended-resource"
	ExtendedResourcePodClaimPrefix  = "fgpu-gpu-"
	ExtendedResourceInitClaimPrefix = "fgpu-init-gpu-"
	ExtendedResourceTemplatePrefix  = "fgpu-gpu-"
	// ExtendedResourceMaxGPUs is the most GPUs one container may ask for this way: the most
	// devices an allocation holds (resource.k8s.io's AllocationResultsMaxSize).
	ExtendedResourceMaxGPUs = resourceapi.AllocationResultsMaxSize
	// ExtendedResourceRequest is the name of the one request in those templates.
	ExtendedResourceRequest = "gpu"
)

// The environment a container of a claim gets for each of its shares (the CDI spec). fgpu's
// own names: a claim of one device gets NAME, and every claim NAME_<i> for its device i.
const (
	EnvGPUUUID               = "FGPU_GPU_UUID"
	EnvDevice                = "FGPU_DEVICE"
	EnvShareID               = "FGPU_SHARE_ID" // the plugin's usage meter maps processes to shares by it
	EnvSharingMode           = "FGPU_SHARING_MODE"
	EnvIsolationDomain       = "FGPU_ISOLATION_DOMAIN"
	EnvMemoryLimitBytes      = "FGPU_MEMORY_LIMIT_BYTES"
	EnvMemoryLimit           = "FGPU_MEMORY_LIMIT"
	EnvMemoryGuaranteedBytes = "FGPU_MEMORY_GUARANTEED_BYTES"
	EnvMemoryGuaranteed      = "FGPU_MEMORY_GUARANTEED"
	EnvComputePercent        = "FGPU_COMPUTE_PERCENT"
	EnvMemoryEnforced        = "FGPU_MEMORY_ENFORCED"
	EnvMemoryEnforcement     = "FGPU_MEMORY_ENFORCEMENT"
	EnvMemoryCap             = "FGPU_MEMORY_CAP"
)

// CUDA's names for an MPS client's settings, which the plugin sets for an MPS share (and the
// pipe and log directories for its MPS daemons too).
const (
	EnvMPSPipeDirectory          = "CUDA_MPS_PIPE_DIRECTORY"
	EnvMPSLogDirectory           = "CUDA_MPS_LOG_DIRECTORY"
	EnvMPSPinnedDeviceMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	EnvMPSActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// FenceTaint is the taint the plugin puts on its devices in allocator mode.
func FenceTaint() resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{Key: FenceTaintKey, Value: FenceTaintValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

// FenceToleration is the toleration the allocator puts in every allocation result.
func FenceToleration() resourceapi.DeviceToleration {
	return resourceapi.DeviceToleration{Key: FenceTaintKey, Operator: resourceapi.DeviceTolerationOpEqual,
		Value: FenceTaintValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

// SharingMode says how co-tenants of one GPU share it.
type SharingMode string

const (
	// SharingModeMPS runs the claim as a client of the GPU's MPS server for its isolation
	// domain: memory and compute caps are enforced by MPS.
	SharingModeMPS SharingMode = "mps"
	// SharingModeTimeSlicing lets the claim's processes time-share the GPU with no memory
	// enforcement; fgpu still accounts the memory it was given.
	SharingModeTimeSlicing SharingMode = "timeSlicing"
)
