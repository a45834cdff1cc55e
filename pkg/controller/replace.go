package controller

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// refusedGPUs remembers, per claim, the GPUs whose kubelet plugin refused to prepare it:
// the model thought they had room, so placing the claim there again would fail again.
type refusedGPUs struct {
	mu  sync.Mutex
	gpu map[types.UID]map[gpuKey]bool
}

func newRefusedGPUs() *refusedGPUs { return &refusedGPUs{gpu: map[types.UID]map[gpuKey]bool{}} }

func (r *refusedGPUs) Add(claim types.UID, g gpuKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gpu[claim] == nil {
		r.gpu[claim] = map[gpuKey]bool{}
	}
	r.gpu[claim][g] = true
}

func (r *refusedGPUs) Has(claim types.UID, g gpuKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gpu[claim][g]
}

func (r *refusedGPUs) Forget(claim types.UID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.gpu, claim)
}

// prepareRefusal returns the device of the claim's allocation whose kubelet plugin refused
// to prepare it for a reason placing it again can fix, and the plugin's condition.
func prepareRefusal(driver string, claim *resourceapi.ResourceClaim) (gpuKey, *metav1.Condition) {
	for _, s := range claim.Status.Devices {
		if s.Driver != driver {
			continue
		}
		for i, cond := range s.Conditions {
			if cond.Type == api.DeviceConditionPrepared && cond.Status == metav1.ConditionFalse &&
				(cond.Reason == api.PrepareReasonOverCommitted || cond.Reason == api.PrepareReasonDeviceGone || cond.Reason == api.PrepareReasonIsolationConflict) {
				return gpuKey{s.Pool, s.Device}, &s.Conditions[i]
			}
		}
	}
	return gpuKey{}, nil
}

// replace takes back an allocation whose prepare the kubelet plugin refused and places the
// claim again: on the node its pod is bound to (another GPU there), anywhere if it is not
// bound. An allocation is immutable, and reservedFor is refused without one: one status
// update clears both, the placement writes the new allocation with the bound pods reserved
// again (the kubelet re-reads the claim on each prepare retry). A claim that cannot be
// placed again waits, saying why, like any pending claim.
func (c *Controller) replace(ctx context.Context, claim *resourceapi.ResourceClaim, g gpuKey, cond *metav1.Condition) (time.Duration, error) {
	if err := c.fenced(); err != nil {
		return 0, err
	}
	c.refused.Add(claim.UID, g)
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.ReservedFor = nil
	cl.Status.Devices = nil
	updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return 0, fmt.Errorf("take back the refused allocation: %w", err)
	}
	c.model.Release(claimKey(claim))
	c.kick()
	pods := c.consumers(claim)
	where := "elsewhere"
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			where = "on node " + p.Spec.NodeName + ", where its pod is bound"
		}
	}
	msg := fmt.Sprintf("the kubelet plugin refused to prepare %s (%s: %s); placing the claim again %s", g, cond.Reason, cond.Message, where)
	klog.FromContext(ctx).Info("Placing a claim again after a refused prepare", "gpu", g.String(), "reason", cond.Reason)
	c.recorder.Event(claim, corev1.EventTypeWarning, ReasonPrepareRefused, msg)
	for _, p := range pods {
		c.recorder.Event(p, corev1.EventTypeWarning, ReasonPrepareRefused, fmt.Sprintf("claim %s: %s", claim.Name, msg))
	}
	return c.place(ctx, updated)
}

// boundReservations are the reservedFor entries of the claim's pods already bound to a
// node: the scheduler will not reserve the claim for them again.
func boundReservations(pods []*corev1.Pod) []resourceapi.ResourceClaimConsumerReference {
	var out []resourceapi.ResourceClaimConsumerReference
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			out = append(out, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p.Name, UID: p.UID})
		}
	}
	return out
}
