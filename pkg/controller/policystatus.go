package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// acceptedChanged reports whether a policy's Accepted condition is not what its spec earns.
func acceptedChanged(p *api.SharingPolicy) bool {
	want := p.Accepted()
	got := meta.FindStatusCondition(p.Status.Conditions, api.ConditionAccepted)
	return got == nil || got.Status != want.Status || got.Reason != want.Reason ||
		got.Message != want.Message || got.ObservedGeneration != want.ObservedGeneration
}

// syncPolicy writes a SharingPolicy's Accepted condition when it changed, and says in an
// event when the policy became invalid. Nothing is written while the condition holds: every
// write is one more for the API server, and would come back as an update.
func (c *Controller) syncPolicy(ctx context.Context, name string) error {
	p, err := c.policies.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if !acceptedChanged(p) {
		return nil
	}
	want := p.Accepted()
	if want.Status == metav1.ConditionFalse {
		// A reference, not the object: the event recorder's scheme does not know fgpu's types.
		ref := &corev1.ObjectReference{APIVersion: api.SchemeGroupVersion.String(), Kind: api.SharingPolicyKind, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion}
		what := "is invalid"
		if want.Reason == api.ReasonUnboundPrivileges {
			what = "applies to no pod"
		}
		c.recorder.Event(ref, corev1.EventTypeWarning, ReasonInvalidPolicy, fmt.Sprintf("SharingPolicy %s %s: %s", p.Name, what, want.Message))
	}
	p = p.DeepCopy()
	meta.SetStatusCondition(&p.Status.Conditions, want)
	if _, err := c.fgpuClient.FgpuV1alpha1().SharingPolicies().UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status of SharingPolicy %s: %w", name, err)
	}
	klog.FromContext(ctx).V(2).Info("SharingPolicy status written", "policy", name, "accepted", want.Status, "reason", want.Reason)
	return nil
}

func (c *Controller) policyWorker(ctx context.Context) {
	for {
		name, quit := c.policyQueue.Get()
		if quit {
			return
		}
		if err := c.syncPolicy(ctx, name); err != nil {
			klog.FromContext(ctx).V(3).Info("Writing a SharingPolicy's status failed, retrying", "err", err)
			c.policyQueue.AddRateLimited(name)
		} else {
			c.policyQueue.Forget(name)
		}
		c.policyQueue.Done(name)
	}
}
