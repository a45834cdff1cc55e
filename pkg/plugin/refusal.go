package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
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

// refusals keeps the refused allocations of claims the allocator places again, in the
// checkpoint (Refused), so a retry, also after a restart, is refused the same way. It runs
// under State's lock, whose checkpoint it writes.
type refusals struct {
	cfg Config
	l   *ledger
}

// maxRefusals bounds the checkpoint's refused allocations; the oldest go first. A claim's
// refusals also go when the claim comes back with another allocation.
const maxRefusals = 512

// before returns the refusal recorded for one of the claim's current allocation
// results, so that the same allocation is refused on every retry: the allocator acts on the
// refusal condition whenever it sees it, so a share prepared after it would be taken back
// from a running pod. Refusals of the claim's earlier allocations are forgotten: a new
// allocation is judged afresh.
func (rs *refusals) before(claim *resourceapi.ResourceClaim) error {
	uid := string(claim.UID)
	var found error
	kept := rs.l.cp.Refused[:0]
	for _, r := range rs.l.cp.Refused {
		if r.ClaimUID == uid && !rs.allocates(claim, r) {
			continue
		}
		kept = append(kept, r)
		if r.ClaimUID == uid && found == nil {
			found = refused(r.Device, r.ShareID, r.Reason, errors.New(r.Message))
		}
	}
	rs.l.cp.Refused = kept
	return found
}

func (rs *refusals) allocates(claim *resourceapi.ResourceClaim, r checkpoint.Refusal) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver == rs.cfg.DriverName && res.Pool == r.Pool && res.Device == r.Device && shareOf(res) == r.ShareID {
			return true
		}
	}
	return false
}

// remember records a prepare refused for a reason the allocator acts on, of a claim
// the allocator will place again (placedAgain). For any other claim a retry may find room.
func (rs *refusals) remember(ctx context.Context, claim *resourceapi.ResourceClaim, err error) {
	var rf *refusal
	if !rs.placedAgain(claim) || !errors.As(err, &rf) {
		return
	}
	cp := rs.l.cp
	cp.Refused = append(cp.Refused, checkpoint.Refusal{ClaimUID: string(claim.UID), Pool: rs.cfg.NodeName,
		Device: rf.device, ShareID: rf.shareID, Reason: rf.reason, Message: rf.Error()})
	if n := len(cp.Refused) - maxRefusals; n > 0 {
		cp.Refused = slices.Delete(cp.Refused, 0, n)
	}
	if err := rs.l.save(); err != nil {
		// Still refused until the plugin restarts.
		klog.FromContext(ctx).Error(err, "Recording a refused prepare in the checkpoint", "claim", klog.KObj(claim))
	}
}

// placedAgain says whether the allocator takes the claim back and places it again when its
// prepare is refused: in allocator mode, a claim it placed (api.PlacedByAllocator). Nothing
// places a claim kube-scheduler allocated (in scheduler mode, or before a switch to
// allocator mode) again, so its refusal is not kept: a retry prepares it once there is room.
func (rs *refusals) placedAgain(claim *resourceapi.ResourceClaim) bool {
	return rs.cfg.Fenced && configapi.PlacedByAllocator(rs.cfg.DriverName, claim)
}

// recorded are the refusals the checkpoint lost of a claim the allocator places again
// (placedAgain): the Prepared=False conditions this node's plugin recorded on the claim's
// status.devices (publishRefusal), for shares of its current allocation. Until the allocator
// acts on them they must stay refused, as remember kept them: the allocator takes
// the allocation back when it reads the condition, also from a running pod.
func (rs *refusals) recorded(claim *resourceapi.ResourceClaim) []checkpoint.Refusal {
	if !rs.placedAgain(claim) {
		return nil
	}
	var out []checkpoint.Refusal
	for _, d := range claim.Status.Devices {
		if d.Driver != rs.cfg.DriverName || d.Pool != rs.cfg.NodeName {
			continue
		}
		c := meta.FindStatusCondition(d.Conditions, configapi.DeviceConditionPrepared)
		if c == nil || c.Status != metav1.ConditionFalse || !slices.Contains(refusalReasons, c.Reason) {
			continue
		}
		r := checkpoint.Refusal{ClaimUID: string(claim.UID), Pool: d.Pool, Device: d.Device, ShareID: ptr.Deref(d.ShareID, ""), Reason: c.Reason, Message: c.Message}
		if rs.allocates(claim, r) {
			out = append(out, r)
		}
	}
	return out
}

// refusalReasons are the reasons of the refusals the allocator acts on.
var refusalReasons = []string{configapi.PrepareReasonOverCommitted, configapi.PrepareReasonDeviceGone, configapi.PrepareReasonIsolationConflict}
