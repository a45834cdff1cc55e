package plugin

import (
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

const testDriver = configapi.DriverName

// claimBuilder keeps tests short: makeClaim("ns", "a").memory("10Gi").obj().
type claimBuilder struct{ c *resourceapi.ResourceClaim }

func makeClaim(ns, name string) *claimBuilder {
	return &claimBuilder{&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + ns + "-" + name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: testDriver, Pool: "node-a", Device: "gpu-0",
				ShareID:          ptrUID("share-" + name),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{},
			}},
		}}},
	}}
}

func ptrUID(s string) *types.UID { u := types.UID(s); return &u }

func (b *claimBuilder) device(name string) *claimBuilder {
	b.c.Status.Allocation.Devices.Results[0].Device = name
	return b
}

func (b *claimBuilder) memory(q string) *claimBuilder {
	b.c.Status.Allocation.Devices.Results[0].ConsumedCapacity[configapi.CapacityMemory] = resource.MustParse(q)
	return b
}

func (b *claimBuilder) compute(pct string) *claimBuilder {
	b.c.Status.Allocation.Devices.Results[0].ConsumedCapacity[configapi.CapacityCompute] = resource.MustParse(pct)
	return b
}

// config adds an fgpu opaque config from the claim; fields is the GpuConfig body.
func (b *claimBuilder) config(fields map[string]any) *claimBuilder {
	body := map[string]any{"apiVersion": "fgpu.dev/v1alpha1", "kind": "GpuConfig"}
	for k, v := range fields {
		body[k] = v
	}
	raw, _ := json.Marshal(body)
	b.c.Status.Allocation.Devices.Config = append(b.c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: testDriver, Parameters: runtime.RawExtension{Raw: raw},
		}},
	})
	return b
}

func (b *claimBuilder) obj() *resourceapi.ResourceClaim { return b.c }
