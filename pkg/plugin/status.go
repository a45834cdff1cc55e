package plugin

import (
	"context"
	"encoding/json"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// capChanged republishes the status.devices of a prepared claim whose memoryCap changed after
// its prepare (a pod of it could not be capped through its cgroup).
func (d *Driver) capChanged(ctx context.Context, ns, name, uid string) {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}}
	if err := d.publishDeviceStatus(ctx, claim); err != nil {
		klog.FromContext(ctx).Error(err, "Updating claim device status", "claim", klog.KObj(claim))
	}
}

// publishDeviceStatus records the prepared shares in the claim's status.devices, replacing
// only this driver's entries. (Not server-side apply: an allocation written with Update by
// another manager made every status apply try to clear it.)
func (d *Driver) publishDeviceStatus(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	var usage map[shareKey]configapi.ShareUsage
	if d.usage != nil {
		usage = d.usage.lastPublished(string(claim.UID))
	}
	return d.publishDeviceStatusWith(ctx, claim, usage)
}

// publishDeviceStatusWith is publishDeviceStatus with the shares' usage summaries.
func (d *Driver) publishDeviceStatusWith(ctx context.Context, claim *resourceapi.ResourceClaim, usage map[shareKey]configapi.ShareUsage) error {
	entry, ok := d.state.PreparedClaims()[string(claim.UID)]
	if !ok {
		return nil
	}
	var ours []resourceapi.AllocatedDeviceStatus
	for _, p := range entry.Devices {
		sd := configapi.DeviceStatusData{
			GPUUUID: p.GPUUUID, Memory: bytesStr(p.MemoryBytes), MemoryLimit: bytesStr(p.MemoryLimitBytes),
			ComputePercent: p.ComputePercent, ThreadPercent: p.ThreadPercent, Mode: p.Mode,
			IsolationDomain: p.IsolationDomain, MemoryEnforced: p.MemoryEnforced, MemoryEnforcement: p.MemoryEnforcement,
			MemoryCap: p.MemoryCap,
		}
		if u, ok := usage[shareKey{string(claim.UID), p.Request, p.Device}]; ok {
			sd.Usage = &u
		}
		data, err := json.Marshal(sd)
		if err != nil {
			return err
		}
		s := resourceapi.AllocatedDeviceStatus{Driver: d.cfg.DriverName, Pool: p.Pool, Device: p.Device, Data: &runtime.RawExtension{Raw: data}}
		if p.ShareID != "" {
			s.ShareID = ptr.To(p.ShareID)
		}
		ours = append(ours, s)
	}
	claims := d.client.ResourceV1().ResourceClaims(claim.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.UID != claim.UID {
			return nil // the claim was replaced; its successor gets its own status
		}
		devices := make([]resourceapi.AllocatedDeviceStatus, 0, len(current.Status.Devices)+len(ours))
		for _, s := range current.Status.Devices {
			if s.Driver != d.cfg.DriverName {
				devices = append(devices, s)
			}
		}
		devices = append(devices, ours...)
		current.Status.Devices = devices
		_, err = claims.UpdateStatus(ctx, current, metav1.UpdateOptions{FieldManager: "fgpu-kubelet-plugin"})
		return err
	})
}
