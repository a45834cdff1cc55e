package invariant

import (
	"strings"
	"testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

func slice(node string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Driver: api.DriverName, Pool: resourceapi.ResourcePool{Name: node},
		Devices: []resourceapi.Device{{Name: "gpu-0", AllowMultipleAllocations: ptr.To(true), Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			api.CapacityMemory: {Value: resource.MustParse("80Gi")}, api.CapacityCompute: {Value: resource.MustParse("100")}}}}}}
}

func claim(name, node, dev, sid, mem, comp string) *resourceapi.ResourceClaim {
	id := types.UID(sid)
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: name, UID: types.UID(name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
			NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: "In", Values: []string{node}}}}}},
			Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: api.DriverName, Pool: node, Device: dev, ShareID: &id,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem), api.CapacityCompute: resource.MustParse(comp)}}}}}}}
}

func TestCheck(t *testing.T) {
	slices := []*resourceapi.ResourceSlice{slice("n1")}
	for _, tc := range []struct {
		name   string
		claims []*resourceapi.ResourceClaim
		want   string
	}{
		{"fits", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "40Gi", "50"), claim("b", "n1", "gpu-0", "s2", "40Gi", "50")}, ""},
		{"memory", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "40Gi", "0"), claim("b", "n1", "gpu-0", "s2", "41Gi", "0")}, "memory 81Gi"},
		{"compute", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "60"), claim("b", "n1", "gpu-0", "s2", "1Gi", "41")}, "compute 101"},
		{"share twice", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "0"), claim("b", "n1", "gpu-0", "s1", "1Gi", "0")}, "handed out twice"},
		{"claim twice", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "0"), claim("a", "n1", "gpu-0", "s2", "1Gi", "0")}, "listed twice"},
		{"no device", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-9", "s1", "1Gi", "0")}, "does not exist"},
		{"wrong node", []*resourceapi.ResourceClaim{func() *resourceapi.ResourceClaim {
			c := claim("a", "n1", "gpu-0", "s1", "1Gi", "0")
			c.Status.Allocation.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values = []string{"n2"}
			return c
		}()}, "node selector names n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.claims, slices)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
