package v1alpha1

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func TestPlacedByAllocator(t *testing.T) {
	claim := resourceapi.AllocationConfigSourceClaim
	result := func(driver string, tolerations ...resourceapi.DeviceToleration) resourceapi.DeviceRequestAllocationResult {
		return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: driver, Pool: "n1", Device: "gpu-0", Tolerations: tolerations}
	}
	for name, tc := range map[string]struct {
		results []resourceapi.DeviceRequestAllocationResult
		configs []resourceapi.DeviceAllocationConfiguration
		want    bool
	}{
		"not allocated": {},
		"kube-scheduler's: no placement, no toleration": {
			results: []resourceapi.DeviceRequestAllocationResult{result(DriverName)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"mode":"mps"`)},
		},
		"the allocator's placement": {
			results: []resourceapi.DeviceRequestAllocationResult{result(DriverName)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"placement":{"policy":"p"}`)},
			want:    true,
		},
		"an older allocator's: the fence toleration only": {
			results: []resourceapi.DeviceRequestAllocationResult{result(DriverName, FenceToleration())},
			want:    true,
		},
		"another driver's result with the toleration": {
			results: []resourceapi.DeviceRequestAllocationResult{result("nic.example.com", FenceToleration())},
		},
		"a placement for another request": {
			results: []resourceapi.DeviceRequestAllocationResult{result(DriverName)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"placement":{}`, "other")},
		},
		"a config that does not decode": {
			results: []resourceapi.DeviceRequestAllocationResult{result(DriverName)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"placement":{},"bogus":1`)},
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := &resourceapi.ResourceClaim{}
			if tc.results != nil {
				c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: tc.results, Config: tc.configs}}
			}
			if got := PlacedByAllocator(DriverName, c); got != tc.want {
				t.Errorf("PlacedByAllocator = %v, want %v", got, tc.want)
			}
		})
	}
}
