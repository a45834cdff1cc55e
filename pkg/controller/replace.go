package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// refusedGPUs remembers, per claim, what placing it again after a refused prepare needs:
// the GPUs whose kubelet plugin refused it (the model thought they had room, so placing the
// claim there again at once would fail again), and the pods kube-scheduler had reserved it
// for, with their node.
type refusedGPUs struct {
	mu sync.Mutex
	m  map[types.UID]*replacement
}

type replacement struct {
	gpus map[model.GPUKey]refusal
	// node and reservedFor pin the next placement: the reserved pods are bound (or being
	// bound) to node, and the scheduler will not reserve the claim for them again. Cleared
	// once that placement is written.
	node        string
	reservedFor []resourceapi.ResourceClaimConsumerReference
}

// refusal is one refused GPU: avoided until its use as the model sees it changes (what the
// plugin counted and the model did not has shown up, or something left), and for at most
// the bind timeout (what the plugin counted may never show in the API).
type refusal struct {
	at  time.Time
	use model.Use
}

func newRefusedGPUs() *refusedGPUs { return &refusedGPUs{m: map[types.UID]*replacement{}} }

// Add records a refused GPU and the reservations the next placement must keep.
func (r *refusedGPUs) Add(claim types.UID, g model.GPUKey, f refusal, node string, reservedFor []resourceapi.ResourceClaimConsumerReference) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rp := r.m[claim]
	if rp == nil {
		rp = &replacement{gpus: map[model.GPUKey]refusal{}}
		r.m[claim] = rp
	}
	rp.gpus[g] = f
	rp.node, rp.reservedFor = node, reservedFor
}

// Avoid reports whether the claim must keep off a GPU that holds use now; it forgets a
// refusal that no longer applies.
func (r *refusedGPUs) Avoid(claim types.UID, g model.GPUKey, use model.Use, now time.Time, ttl time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rp := r.m[claim]
	if rp == nil {
		return false
	}
	f, ok := rp.gpus[g]
	if !ok {
		return false
	}
	if f.use != use || now.Sub(f.at) >= ttl {
		delete(rp.gpus, g)
		return false
	}
	return true
}

// Refused reports, changing nothing, whether the claim's plugin refused GPU g within ttl,
// whatever g holds now: a reclamation's what-if asks it of a GPU it would empty.
func (r *refusedGPUs) Refused(claim types.UID, g model.GPUKey, now time.Time, ttl time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	rp := r.m[claim]
	if rp == nil {
		return false
	}
	f, ok := rp.gpus[g]
	return ok && now.Sub(f.at) < ttl
}

// Next is how long until the claim's earliest refusal runs out (0: none left).
func (r *refusedGPUs) Next(claim types.UID, now time.Time, ttl time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := time.Duration(0)
	if rp := r.m[claim]; rp != nil {
		for _, f := range rp.gpus {
			if left := f.at.Add(ttl).Sub(now); left > 0 && (next == 0 || left < next) {
				next = left
			}
		}
	}
	return next
}

// Pinned returns the node and reservations the claim's next placement must keep.
func (r *refusedGPUs) Pinned(claim types.UID) (string, []resourceapi.ResourceClaimConsumerReference) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rp := r.m[claim]; rp != nil {
		return rp.node, rp.reservedFor
	}
	return "", nil
}

// Placed forgets the pin once the placement that keeps it was written.
func (r *refusedGPUs) Placed(claim types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rp := r.m[claim]; rp != nil {
		rp.node, rp.reservedFor = "", nil
	}
}

func (r *refusedGPUs) Forget(claim types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.m, claim)
}

// prepareRefusal returns the device of the claim's allocation whose kubelet plugin refused
// to prepare it for a reason placing it again can fix, and the plugin's condition. Only a
// condition on a device and share of the current allocation counts: one left from an
// earlier allocation of the same device (another share ID) says nothing about this one.
func prepareRefusal(driver string, claim *resourceapi.ResourceClaim) (model.GPUKey, *metav1.Condition) {
	for _, s := range claim.Status.Devices {
		if s.Driver != driver || !allocates(claim.Status.Allocation, s) {
			continue
		}
		for i, cond := range s.Conditions {
			if cond.Type == api.DeviceConditionPrepared && cond.Status == metav1.ConditionFalse &&
				(cond.Reason == api.PrepareReasonOverCommitted || cond.Reason == api.PrepareReasonDeviceGone || cond.Reason == api.PrepareReasonIsolationConflict) {
				return model.GPUKey{Pool: s.Pool, Device: s.Device}, &s.Conditions[i]
			}
		}
	}
	return model.GPUKey{}, nil
}

// allocates reports whether the device status is about a result of the allocation: same
// driver, pool, device and share ID.
func allocates(a *resourceapi.AllocationResult, s resourceapi.AllocatedDeviceStatus) bool {
	if a == nil {
		return false
	}
	for _, r := range a.Devices.Results {
		if r.Driver == s.Driver && r.Pool == s.Pool && r.Device == s.Device && string(ptr.Deref(r.ShareID, "")) == ptr.Deref(s.ShareID, "") {
			return true
		}
	}
	return false
}

// replace takes back an allocation whose prepare the kubelet plugin refused and places the
// claim again. An allocation is immutable, and reservedFor is refused without one: one
// status update clears both, and the new placement writes the allocation with the
// reservations of the pods that still exist (kube-scheduler reserved the claim for them and
// bound them to the old allocation's node; it will not reserve it again, and the kubelet
// re-reads the claim on each prepare retry), on that node. A claim none of whose pods was
// reserved is placed anywhere. One that cannot be placed again waits, saying why, like any
// pending claim.
func (c *Controller) replace(ctx context.Context, claim *resourceapi.ResourceClaim, g model.GPUKey, cond *metav1.Condition) (time.Duration, error) {
	if err := c.fenced(); err != nil {
		return 0, err
	}
	keep, err := c.liveReservations(ctx, claim)
	if err != nil {
		return 0, err
	}
	node := ""
	if len(keep) > 0 {
		node = allocatedNode(claim.Status.Allocation)
	}
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.ReservedFor = nil
	cl.Status.Devices = nil
	updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return 0, fmt.Errorf("take back the refused allocation: %w", err)
	}
	c.model.Release(claimKey(claim))
	c.refused.Add(claim.UID, g, refusal{at: c.now(), use: c.model.UseOf(g)}, node, keep)
	c.kick()
	pods := c.consumers(claim)
	where := "elsewhere"
	if node != "" {
		where = "on node " + node + ", where its pod is bound"
	}
	msg := fmt.Sprintf("the kubelet plugin refused to prepare %s (%s: %s); placing the claim again %s", g, cond.Reason, cond.Message, where)
	klog.FromContext(ctx).Info("Placing a claim again after a refused prepare", "gpu", g.String(), "reason", cond.Reason, "node", node)
	c.recorder.Event(claim, corev1.EventTypeWarning, ReasonPrepareRefused, msg)
	for _, p := range pods {
		c.recorder.Event(p, corev1.EventTypeWarning, ReasonPrepareRefused, fmt.Sprintf("claim %s: %s", claim.Name, msg))
	}
	return c.place(ctx, updated)
}

// liveReservations are the claim's reservedFor entries whose consumer still exists. The pod
// informer may not show a pod yet (nor its binding): a pod it does not have is asked for.
// Consumers other than pods are kept as they are.
func (c *Controller) liveReservations(ctx context.Context, claim *resourceapi.ResourceClaim) ([]resourceapi.ResourceClaimConsumerReference, error) {
	var out []resourceapi.ResourceClaimConsumerReference
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			out = append(out, r)
			continue
		}
		p, err := c.pods.Pods(claim.Namespace).Get(r.Name)
		if apierrors.IsNotFound(err) {
			p, err = c.client.CoreV1().Pods(claim.Namespace).Get(ctx, r.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
		}
		if err != nil {
			return nil, fmt.Errorf("look up reserved pod %s: %w", r.Name, err)
		}
		if p.UID == r.UID && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			out = append(out, r)
		}
	}
	return out, nil
}
