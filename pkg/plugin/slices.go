package plugin

import (
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// AllocatableMemory is what a GPU offers to claims: its memory less the reserve for the
// driver and the MPS server, rounded down to the share granularity so that the whole GPU
// is always a valid request.
func AllocatableMemory(d gpu.Device, reserved int64) int64 {
	free := d.MemoryBytes - reserved
	if free < configapi.MemoryStep {
		return 0
	}
	return free / configapi.MemoryStep * configapi.MemoryStep
}

// DriverResources is the node's pool: one device per GPU, shareable by many claims, with
// consumable memory and compute.
//
// A claim that names no capacity gets the defaults: all of the GPU's memory (so no one
// else fits: a whole GPU) and no reserved compute. A claim that names memory only gets
// that memory and no reserved compute: its kernels are not capped and share SMs by time
// with the GPU's other tenants. Naming compute reserves that percent of SMs and caps the
// claim's MPS active thread percentage to it.
//
// A GPU in foreign (by device name: the processes fgpu did not start on it) carries the
// NoSchedule taint configapi.ForeignTaintKey, so that neither kube-scheduler nor the
// allocator puts a new claim there; claims already allocated to it stay. A faulty GPU
// carries its fault taints (by device name: health.go's taints), NoExecute where its work
// cannot go on.
//
// The attribute memoryEnforcement says what caps an MPS share's memory on each GPU:
// "cgroup" where the kernel's dmem controller partitions it (cgroupCaps, by device name), else
// "mps-per-process".
func DriverResources(nodeName string, devs []gpu.Device, reserved int64, fenced bool, foreign map[string][]int, faults map[string][]resourceapi.DeviceTaint, cgroupCaps map[string]bool) resourceslice.DriverResources {
	devices := make([]resourceapi.Device, 0, len(devs))
	for _, d := range devs {
		mem := resource.NewQuantity(AllocatableMemory(d, reserved), resource.BinarySI)
		dev := resourceapi.Device{
			Name:                     d.Name(),
			AllowMultipleAllocations: ptr.To(true),
			Attributes:               attributes(d, cgroupCaps[d.Name()]),
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				configapi.CapacityMemory: {
					Value: *mem,
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: mem,
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  resource.NewQuantity(configapi.MemoryStep, resource.BinarySI),
							Max:  mem,
							Step: resource.NewQuantity(configapi.MemoryStep, resource.BinarySI),
						},
					},
				},
				configapi.CapacityCompute: {
					Value: resource.MustParse("100"),
					RequestPolicy: &resourceapi.CapacityRequestPolicy{
						Default: ptr.To(resource.MustParse("0")),
						ValidRange: &resourceapi.CapacityRequestPolicyRange{
							Min:  ptr.To(resource.MustParse("0")),
							Max:  ptr.To(resource.MustParse("100")),
							Step: ptr.To(resource.MustParse("1")),
						},
					},
				},
			},
		}
		if fenced {
			dev.Taints = append(dev.Taints, configapi.FenceTaint())
		}
		if pids := foreign[d.Name()]; len(pids) > 0 {
			dev.Taints = append(dev.Taints, resourceapi.DeviceTaint{Key: configapi.ForeignTaintKey, Value: strconv.Itoa(len(pids)), Effect: resourceapi.DeviceTaintEffectNoSchedule})
		}
		dev.Taints = append(dev.Taints, faults[d.Name()]...)
		devices = append(devices, dev)
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		nodeName: {Slices: []resourceslice.Slice{{Devices: devices}}},
	}}
}

func attributes(d gpu.Device, cgroupCap bool) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		configapi.AttributeMemoryCap:    {StringValue: ptr.To(memoryCap(string(configapi.SharingModeMPS), cgroupCap))},
		configapi.AttributeUUID:         {StringValue: ptr.To(d.UUID)},
		configapi.AttributeProductName:  {StringValue: ptr.To(d.ProductName)},
		configapi.AttributeArchitecture: {StringValue: ptr.To(d.Architecture)},
		configapi.AttributeIndex:        {IntValue: ptr.To(int64(d.Index))},
		configapi.AttributeMinor:        {IntValue: ptr.To(int64(d.Minor))},
		configapi.AttributeComputeMode:  {StringValue: ptr.To(string(d.ComputeMode))},
	}
	if v := semver(d.CUDAComputeCapability); v != "" {
		a[configapi.AttributeCUDAComputeCapability] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if v := semver(d.DriverVersion); v != "" {
		a[configapi.AttributeDriverVersion] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if v := semver(d.CUDADriverVersion); v != "" {
		a[configapi.AttributeCUDADriverVersion] = resourceapi.DeviceAttribute{VersionValue: ptr.To(v)}
	}
	if d.PCIBusID != "" {
		a["resource.kubernetes.io/pciBusID"] = resourceapi.DeviceAttribute{StringValue: ptr.To(d.PCIBusID)}
	}
	if d.NUMANode >= 0 {
		a[configapi.AttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.NUMANode))}
		a[configapi.AttributeNUMANodeStandard] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(d.NUMANode))}
	}
	// Only where known: under a claim's matchAttribute a missing attribute matches nothing,
	// where an empty one would make all the GPUs that lack it look alike.
	for name, v := range map[resourceapi.QualifiedName]string{
		configapi.AttributePCIeRoot:     d.PCIeRoot,
		configapi.AttributeNVLinkIsland: d.NVLinkIsland,
		configapi.AttributeFabricClique: d.FabricClique,
		configapi.AttributeCPUAffinity:  d.CPUAffinity,
	} {
		if v != "" {
			a[name] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		}
	}
	return a
}

// semver turns "9.0" or "580.65.06" into a valid semantic version ("9.0.0", "580.65.6").
func semver(v string) string {
	parts := strings.Split(v, ".")
	if v == "" || len(parts) > 3 {
		return ""
	}
	for len(parts) < 3 {
		parts = append(parts, "0")
	}
	for i, p := range parts {
		n, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return ""
		}
		parts[i] = fmt.Sprint(n)
	}
	return strings.Join(parts, ".")
}
