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
