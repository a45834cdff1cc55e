package plugin

import (
	"context"
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// refusal is a prepare refused for a reason that placing the claim again can fix: the
// allocation asks for what is not on this node (any more), or for a GPU it may not share.
type refusal struct {
	device  string
	shareID string // the refused result's share; empty for a whole GPU
	reason  string // configapi.PrepareReason*
	err     error
}

func (r *refusal) Error() string { return r.err.Error() }
func (r *refusal) Unwrap() error { return r.err }

func refused(device, shareID, reason string, err error) error {
	return &refusal{device: device, shareID: shareID, reason: reason, err: err}
}

// maxConditionMessage is the API's limit on a condition's message.
const maxConditionMessage = 32768

// publishRefusal records a refused prepare on the claim, as a Prepared=False condition on
// the refused device's status.devices entry, where the allocator sees it and places the
// claim again. It replaces only that device and share's entry.
func (d *Driver) publishRefusal(ctx context.Context, claim *resourceapi.ResourceClaim, prepareErr error) error {
	var rf *refusal
	if !errors.As(prepareErr, &rf) {
		return nil
	}
	msg := prepareErr.Error()
	if len(msg) > maxConditionMessage {
		msg = msg[:maxConditionMessage]
	}
	claims := d.client.ResourceV1().ResourceClaims(claim.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := claims.Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if current.UID != claim.UID || current.Status.Allocation == nil {
			return nil // replaced or deallocated: nothing to report on
		}
		var res *resourceapi.DeviceRequestAllocationResult
		for i, r := range current.Status.Allocation.Devices.Results {
			if r.Driver == d.cfg.DriverName && r.Pool == d.cfg.NodeName && r.Device == rf.device && shareOf(r) == rf.shareID {
				res = &current.Status.Allocation.Devices.Results[i]
				break
			}
		}
		if res == nil {
			return nil // allocated anew by now
		}
		var shareID *string
		if res.ShareID != nil {
			shareID = ptr.To(string(*res.ShareID))
		}
		entry := resourceapi.AllocatedDeviceStatus{Driver: res.Driver, Pool: res.Pool, Device: res.Device, ShareID: shareID,
			Conditions: []metav1.Condition{{Type: configapi.DeviceConditionPrepared, Status: metav1.ConditionFalse, Reason: rf.reason,
				Message: msg, LastTransitionTime: metav1.Now(), ObservedGeneration: current.Generation}}}
		devices := make([]resourceapi.AllocatedDeviceStatus, 0, len(current.Status.Devices)+1)
		for _, s := range current.Status.Devices {
			if s.Driver != res.Driver || s.Pool != res.Pool || s.Device != res.Device || ptr.Deref(s.ShareID, "") != ptr.Deref(shareID, "") {
				devices = append(devices, s)
			}
		}
		devices = append(devices, entry)
		current.Status.Devices = devices
		_, err = claims.UpdateStatus(ctx, current, metav1.UpdateOptions{FieldManager: "fgpu-kubelet-plugin"})
		if err != nil {
			return fmt.Errorf("recording the refused prepare: %w", err)
		}
		return nil
	})
}

func shareOf(r resourceapi.DeviceRequestAllocationResult) string {
	if r.ShareID == nil {
		return ""
	}
	return string(*r.ShareID)
}
