package clusterview

import (
	"bytes"
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
)

func TestGatherAndPrint(t *testing.T) {
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "s"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.fgpu.dev", Pool: resourceapi.ResourcePool{Name: "n1"}, Devices: []resourceapi.Device{{
			Name:       "gpu-0",
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"productName": {StringValue: ptr.To("NVIDIA H100")}},
			Capacity:   map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("79Gi")}},
		}}},
	}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "c"},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: "gpu.fgpu.dev", Pool: "n1", Device: "gpu-0", ShareID: ptr.To(types.UID("s1")),
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("10Gi"), "compute": resource.MustParse("25")},
			}}}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "web-1"}, {Resource: "pods", Name: "a-replica-with-a-name-long-enough-to-need-cutting-x7k2p"}},
			Devices:     []resourceapi.AllocatedDeviceStatus{{Driver: "gpu.fgpu.dev", Pool: "n1", Device: "gpu-0", Data: &runtime.RawExtension{Raw: []byte(`{"mode":"mps"}`)}}},
		},
	}
	other := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "unallocated"}}
	gpus, err := Gather(context.Background(), fake.NewClientset(slice, claim, other), "gpu.fgpu.dev")
	if err != nil {
		t.Fatal(err)
	}
	if len(gpus) != 1 || len(gpus[0].Tenants) != 1 {
		t.Fatalf("gpus %+v", gpus)
	}
	if mem, compute := gpus[0].Used(); mem != 10<<30 || compute != 25 {
		t.Fatalf("used %d %d", mem, compute)
	}
	var buf bytes.Buffer
	if err := Print(&buf, gpus); err != nil {
		t.Fatal(err)
	}
	fits80(t, buf.String())
	lines := strings.Split(buf.String(), "\n")
	column := func(line, s string) int {
		before, _, ok := strings.Cut(line, s)
		if !ok {
			t.Fatalf("%q lacks %q", line, s)
		}
		return len([]rune(before))
	}
	if column(lines[0], "MODE") != column(lines[2], "mps") {
		t.Errorf("the mode is not under MODE:\n%s", buf.String())
	}
	var back []GPU
	roundTrip(t, gpus, &back)
	if back[0].Tenants[0].Memory != 10<<30 || back[0].Tenants[0].Pods[0] != "web-1" {
		t.Errorf("json %+v", back)
	}
	for _, want := range []string{"n1/gpu-0", "10Gi/79Gi", "team-a/web-1", "mps", "25%"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}
