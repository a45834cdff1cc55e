package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	fgpulisters "github.com/fgpu-dev/fgpu/pkg/client/listers/fgpu.dev/v1alpha1"
)

// acceptedChanged reports whether a policy's Accepted condition is not what its spec earns.
func acceptedChanged(p *api.SharingPolicy) bool {
	want := p.Accepted()
	got := meta.FindStatusCondition(p.Status.Conditions, api.ConditionAccepted)
	return got == nil || got.Status != want.Status || got.Reason != want.Reason ||
		got.Message != want.Message || got.ObservedGeneration != want.ObservedGeneration
}

// policyStatus writes the SharingPolicies' Accepted condition, one policy of its queue at a
// time (onPolicy queues those whose condition must change).
type policyStatus struct {
	queue    workqueue.TypedRateLimitingInterface[string]
	policies fgpulisters.SharingPolicyLister
	client   versioned.Interface
	recorder record.EventRecorder
}

// sync writes a SharingPolicy's Accepted condition when it changed, and says in an event
// when the policy became invalid. Nothing is written while the condition holds: every write
// is one more for the API server, and would come back as an update.
func (ps *policyStatus) sync(ctx context.Context, name string) error {
	p, err := ps.policies.Get(name)
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
		ps.recorder.Event(ref, corev1.EventTypeWarning, ReasonInvalidPolicy, fmt.Sprintf("SharingPolicy %s %s: %s", p.Name, what, want.Message))
	}
	p = p.DeepCopy()
	meta.SetStatusCondition(&p.Status.Conditions, want)
	if _, err := ps.client.FgpuV1alpha1().SharingPolicies().UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("status of SharingPolicy %s: %w", name, err)
	}
	klog.FromContext(ctx).V(2).Info("SharingPolicy status written", "policy", name, "accepted", want.Status, "reason", want.Reason)
	return nil
}

func (ps *policyStatus) worker(ctx context.Context) {
	for {
		name, quit := ps.queue.Get()
		if quit {
			return
		}
		if err := ps.sync(ctx, name); err != nil {
			klog.FromContext(ctx).V(3).Info("Writing a SharingPolicy's status failed, retrying", "err", err)
			ps.queue.AddRateLimited(name)
		} else {
			ps.queue.Forget(name)
		}
		ps.queue.Done(name)
	}
}
