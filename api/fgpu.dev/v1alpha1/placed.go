package v1alpha1

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
)

// PlacedByAllocator reports whether the fgpu allocator placed the claim: its allocation
// carries the allocator's Placement for one of driver's devices, or (an allocator older than
// the Placement record) a result of driver's that tolerates the allocation fence. Only the
// allocator can write either: tenants cannot write claim status, the allocator refuses a
// placement in a claim's or a class's config, admission refuses the fence toleration in
// claims and templates, and in allocator mode kube-scheduler cannot allocate fenced devices
// without it. Metadata (annotations, finalizers) is not looked at: a tenant can write it.
// The allocator and the kubelet plugin both decide by it: only such a claim is placed again
// after a refused prepare.
func PlacedByAllocator(driver string, claim *resourceapi.ResourceClaim) bool {
	a := claim.Status.Allocation
	if a == nil {
		return false
	}
	for _, r := range a.Devices.Results {
		if r.Driver != driver {
			continue
		}
		if FenceTolerated(r) {
			return true
		}
		// A config that does not decode was not written by the allocator.
		if cfg, err := MergeConfigs(driver, a.Devices.Config, r.Request); err == nil && cfg.Placement != nil {
			return true
		}
	}
	return false
}

// FenceTolerated reports whether an allocation result tolerates the allocation fence, as
// every result the allocator writes does.
func FenceTolerated(r resourceapi.DeviceRequestAllocationResult) bool {
	return slices.ContainsFunc(r.Tolerations, func(t resourceapi.DeviceToleration) bool { return t.Key == FenceTaintKey })
}
