package plugin

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	corelisters "k8s.io/client-go/listers/core/v1"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// room judges whether a planned claim fits next to the prepared ones. It has no side
// effects and reads the ledger, so it runs under State's lock, which also guards pods.
type room struct {
	cfg     Config
	devices map[string]gpu.Device // by device name
	l       *ledger
	// pods is the node's pod watch (nil without it): where its pods are gone, a prepared
	// claim is about to be unprepared (State.checkRoom).
	pods corelisters.PodLister
}

// checkCapacity is the last line of defence against over-commit: the API server checks no
// capacity, so an allocation written by anyone is re-checked against what this node holds.
func (r *room) checkCapacity(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) error {
	for _, p := range planned {
		d := r.devices[p.Device]
		allocatable := AllocatableMemory(d, r.cfg.ReservedMemory)
		usedMem, usedCompute, tenants := int64(0), int64(0), 0
		for uid, e := range r.l.cp.Claims {
			if uid == string(claim.UID) {
				continue
			}
			for _, q := range e.Devices {
				if q.Device == p.Device {
					usedMem += q.MemoryBytes
					usedCompute += q.ComputePercent
					tenants++
				}
			}
		}
		if usedMem+p.MemoryBytes > allocatable {
			return refused(p.Device, p.ShareID, configapi.PrepareReasonOverCommitted, fmt.Errorf("refusing to over-commit GPU %s (%s): claim %s/%s asks %s memory, %s of %s allocatable is already prepared for %d other claim(s)",
				p.Device, d.UUID, claim.Namespace, claim.Name, bytesStr(p.MemoryBytes), bytesStr(usedMem), bytesStr(allocatable), tenants))
		}
		if usedCompute+p.ComputePercent > 100 {
			return refused(p.Device, p.ShareID, configapi.PrepareReasonOverCommitted, fmt.Errorf("refusing to over-commit GPU %s (%s): claim %s/%s asks %d%% compute, %d%% of 100%% is already prepared for %d other claim(s)",
				p.Device, d.UUID, claim.Namespace, claim.Name, p.ComputePercent, usedCompute, tenants))
		}
	}
	return nil
}

// checkIsolation refuses a share that would put a second isolation domain on a GPU where one
// of them must be alone: a claim told FGPU_MEMORY_ENFORCED=true (MPS on a placement that keeps
// the GPU to its domain) is capped only while its MPS server is the only user of the GPU
// (EXCLUSIVE_PROCESS). Another domain's MPS server or time-sliced processes would drop the
// GPU to the default compute mode, where a process that bypasses MPS is not capped. Whoever
// wrote the allocation (a deposed allocator, a lagging informer), the plugin keeps that
// promise. The message names no other claim: it is recorded on this claim, which another
// namespace may own.
func (r *room) checkIsolation(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) error {
	for _, p := range planned {
		if !sharedMode(p.Mode) {
			continue
		}
		for uid, e := range r.l.cp.Claims {
			if uid == string(claim.UID) {
				continue
			}
			for _, q := range e.Devices {
				if q.Device != p.Device || !sharedMode(q.Mode) || q.MPSKey == p.MPSKey || (!p.MemoryEnforced && !q.MemoryEnforced) {
					continue
				}
				keeps := "that share's placement keeps the GPU to its own domain"
				if p.MemoryEnforced {
					keeps = "the claim's placement keeps the GPU to its own domain"
				}
				return refused(p.Device, p.ShareID, configapi.PrepareReasonIsolationConflict, fmt.Errorf("refusing to put a second isolation domain on GPU %s (%s): claim %s/%s (%s, domain %s) would share it with another domain's %s share, and %s",
					p.Device, r.devices[p.Device].UUID, claim.Namespace, claim.Name, p.Mode, p.IsolationDomain, q.Mode, keeps))
			}
		}
	}
	return nil
}

// leavingNextTo are the other claims prepared on the planned GPUs whose pods are all gone
// from this node's API view (deleted, replaced or finished): the kubelet is about to
// unprepare them. Unknown without the node's pod watch.
func (r *room) leavingNextTo(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) []string {
	if r.pods == nil {
		return nil
	}
	var out []string
	for uid, e := range r.l.cp.Claims {
		if uid == string(claim.UID) || len(e.Pods) == 0 || !slices.ContainsFunc(e.Devices, func(q checkpoint.PreparedDevice) bool {
			return slices.ContainsFunc(planned, func(p checkpoint.PreparedDevice) bool { return p.Device == q.Device })
		}) {
			continue
		}
		if !slices.ContainsFunc(e.Pods, func(ref checkpoint.PodRef) bool { return r.podRuns(e.Namespace, ref) }) {
			out = append(out, uid)
		}
	}
	return out
}

// podRuns reports whether the node's pod watch still shows the pod, not deleted or finished.
func (r *room) podRuns(ns string, ref checkpoint.PodRef) bool {
	p, err := r.pods.Pods(ns).Get(ref.Name)
	return err == nil && string(p.UID) == ref.UID && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// sharedMode: a share that others may use the GPU next to (not a whole GPU).
func sharedMode(mode string) bool {
	return mode == string(configapi.SharingModeMPS) || mode == string(configapi.SharingModeTimeSlicing)
}
