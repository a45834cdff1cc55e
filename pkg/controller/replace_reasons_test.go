package controller

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// Every reason the kubelet plugin gives for a refusal that placing again can fix makes the
// allocator place the claim again; any other reason does not.
func TestPrepareRefusalReasons(t *testing.T) {
	for reason, want := range map[string]bool{
		api.PrepareReasonOverCommitted:     true,
		api.PrepareReasonDeviceGone:        true,
		api.PrepareReasonIsolationConflict: true,
		"SomethingElse":                    false,
	} {
		share := "00000000-0000-4000-8000-000000000001"
		claim := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: api.DriverName, Pool: "n1", Device: "gpu-0", ShareID: ptr.To(types.UID(share)),
			}}}},
			Devices: []resourceapi.AllocatedDeviceStatus{{
				Driver: api.DriverName, Pool: "n1", Device: "gpu-0", ShareID: ptr.To(share),
				Conditions: []metav1.Condition{{Type: api.DeviceConditionPrepared, Status: metav1.ConditionFalse, Reason: reason}},
			}}}}
		g, cond := prepareRefusal(api.DriverName, claim)
		if got := cond != nil; got != want || (want && g != (model.GPUKey{Pool: "n1", Device: "gpu-0"})) {
			t.Errorf("reason %s: placed again %v on %v, want %v", reason, got, g, want)
		}
	}
}
