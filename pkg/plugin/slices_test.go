package plugin

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestTopologyAttributesOnlyWhereKnown(t *testing.T) {
	placed := gpu.Device{
		Index: 4, UUID: "GPU-4", PCIBusID: "0000:98:00.0", NUMANode: 1,
		PCIeRoot: "pci0000:80", NVLinkIsland: "nvl-4", FabricClique: "9bd4e4d0-5a1b-5e3c-8a8e-4f1f0c6e2d71.1",
		CPUAffinity: "32-63,96-127",
	}
	res := DriverResources(node, []gpu.Device{placed, {Index: 5, UUID: "GPU-5", NUMANode: -1}}, 0, false, nil, nil, nil)
	devs := res.Pools[node].Slices[0].Devices

	got := devs[0].Attributes
	for name, want := range map[resourceapi.QualifiedName]string{
		"resource.kubernetes.io/pcieRoot": "pci0000:80",
		"resource.kubernetes.io/pciBusID": "0000:98:00.0",
		"nvlinkIsland":                    "nvl-4",
		"fabricClique":                    "9bd4e4d0-5a1b-5e3c-8a8e-4f1f0c6e2d71.1",
		"cpuAffinity":                     "32-63,96-127",
	} {
		if a, ok := got[name]; !ok || a.StringValue == nil || *a.StringValue != want {
			t.Errorf("gpu-4 attribute %s = %+v, want string %q", name, a, want)
		}
	}
	for _, name := range []resourceapi.QualifiedName{configapi.AttributeNUMANode, configapi.AttributeNUMANodeStandard} {
		if a := got[name]; a.IntValue == nil || *a.IntValue != 1 {
			t.Errorf("gpu-4 %s = %+v, want 1", name, a)
		}
	}

	// A GPU whose place is unknown, or without NVLink peers, carries none of them: a claim's
	// matchAttribute must not find it alike to another such GPU.
	for _, name := range []resourceapi.QualifiedName{
		configapi.AttributePCIeRoot, configapi.AttributeNVLinkIsland, configapi.AttributeFabricClique,
		configapi.AttributeCPUAffinity, configapi.AttributeNUMANode, configapi.AttributeNUMANodeStandard, "resource.kubernetes.io/pciBusID",
	} {
		if a, ok := devs[1].Attributes[name]; ok {
			t.Errorf("gpu-5 publishes %s = %+v though it is unknown", name, a)
		}
	}
}
