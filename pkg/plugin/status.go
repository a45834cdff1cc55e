package plugin

import (
	"context"
	"encoding/json"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
)

// DeviceStatusData is what `kubectl get resourceclaim -o yaml` shows under
// status.devices[].data for an fgpu share.
type DeviceStatusData struct {
	GPUUUID         string `json:"gpuUUID"`
	Memory          string `json:"memory"`
	MemoryLimit     string `json:"memoryLimit"`
	ComputePercent  int64  `json:"computePercent"`
	ThreadPercent   int64  `json:"threadPercent"`
	Mode            string `json:"mode"`
	IsolationDomain string `json:"isolationDomain"`
	// MemoryEnforced is false under time-slicing: nothing stops a tenant from using more.
	MemoryEnforced bool `json:"memoryEnforced"`
}

// publishDeviceStatus records the prepared shares in the claim's status.devices with
// server-side apply, owning only this driver's entries.
func (d *Driver) publishDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	entry, ok := d.state.PreparedClaims()[string(claim.UID)]
	if !ok {
		return nil
	}
	status := resourceapply.ResourceClaimStatus()
	for _, p := range entry.Devices {
		data, err := json.Marshal(DeviceStatusData{
			GPUUUID: p.GPUUUID, Memory: bytesStr(p.MemoryBytes), MemoryLimit: bytesStr(p.MemoryLimitBytes),
			ComputePercent: p.ComputePercent, ThreadPercent: p.ThreadPercent, Mode: p.Mode,
			IsolationDomain: p.IsolationDomain, MemoryEnforced: p.Mode != "timeSlicing",
		})
		if err != nil {
			return err
		}
		dev := resourceapply.AllocatedDeviceStatus().WithDriver(d.cfg.DriverName).WithPool(p.Pool).WithDevice(p.Device).
			WithData(runtime.RawExtension{Raw: data})
		if p.ShareID != "" {
			dev = dev.WithShareID(p.ShareID)
		}
		status = status.WithDevices(dev)
	}
	ac := resourceapply.ResourceClaim(claim.Name, claim.Namespace).WithUID(claim.UID).WithStatus(status)
	_, err := d.client.ResourceV1().ResourceClaims(claim.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: d.cfg.DriverName, Force: true})
	return err
}
