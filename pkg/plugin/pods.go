package plugin

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// podsOf are the pods of this node the claim is reserved for, each checked against the API
// (same UID, bound to this node): the UID then comes from the API server, not from anything a
// tenant wrote. They receive the cgroup caps and own the measured use of their processes.
// Where a GPU is cgroup-capped, a pod that cannot be looked up fails the prepare (the kubelet
// retries): preparing without it would leave it uncapped; elsewhere only its measured use
// would be missed, which fails nothing.
func (d *Driver) podsOf(ctx context.Context, claim *resourceapi.ResourceClaim) ([]checkpoint.PodRef, error) {
	var out []checkpoint.PodRef
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.client.CoreV1().Pods(claim.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil && !d.state.caps.active() {
			klog.FromContext(ctx).Error(err, "Looking up a pod of the claim; its GPU use is not measured", "pod", klog.KRef(claim.Namespace, ref.Name))
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("look up pod %s/%s of the claim for its GPU memory cgroup cap: %w", claim.Namespace, ref.Name, err)
		}
		if pod.UID != ref.UID || pod.Spec.NodeName != d.cfg.NodeName {
			continue
		}
		out = append(out, podRef(pod))
	}
	return out, nil
}

// podRef is how a claim's pod is recorded.
func podRef(pod *corev1.Pod) checkpoint.PodRef {
	owner := metav1.GetControllerOf(pod)
	return checkpoint.PodRef{UID: string(pod.UID), Name: pod.Name,
		DaemonSet: owner != nil && owner.Kind == "DaemonSet" && strings.HasPrefix(owner.APIVersion, "apps/")}
}

// podResync is how often every pod of the node is looked at again: a pod whose claim could not
// be read is tried again then.
const podResync = time.Minute

// watchPods records (and caps) the pods that join a claim already prepared here. The kubelet
// prepares a claim once, for the first of its pods on the node, and never again for a later
// pod sharing it, so such pods are found by watching this node's pods. Run where a GPU is
// cgroup-capped, GPU use is measured (observe mode names its pods from it) or MPS daemons are
// guarded against eviction.
func (d *Driver) watchPods(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(d.client, podResync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", d.cfg.NodeName).String()
	}))
	inf := factory.Core().V1().Pods().Informer()
	d.state.usePodWatch(factory.Core().V1().Pods().Lister())
	if d.observe != nil {
		d.observe.pods = factory.Core().V1().Pods().Lister()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { d.podSeen(ctx, obj) },
		UpdateFunc: func(_, obj any) { d.podSeen(ctx, obj) },
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	return nil
}

// podSeen caps a pod of this node in each prepared claim that is reserved for it, and records
// a recorded pod's change of controller (a DaemonSet's pod or not: see daemonGuards.mark). The claim
// names in the pod are only candidates (a tenant writes spec.resourceClaims): the claim read
// from the API must be the prepared one and list the pod's UID in status.reservedFor, which
// the scheduler writes.
func (d *Driver) podSeen(ctx context.Context, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.Spec.NodeName != d.cfg.NodeName || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	var names []string
	for _, c := range pod.Spec.ResourceClaims {
		if c.ResourceClaimName != nil {
			names = append(names, *c.ResourceClaimName)
		}
	}
	for _, c := range pod.Status.ResourceClaimStatuses {
		if c.ResourceClaimName != nil {
			names = append(names, *c.ResourceClaimName)
		}
	}
	logger := klog.FromContext(ctx)
	ref := podRef(pod)
	for _, name := range names {
		uid, pods := d.state.preparedClaim(pod.Namespace, name)
		if uid == "" || slices.Contains(pods, ref) {
			continue
		}
		if slices.ContainsFunc(pods, func(p checkpoint.PodRef) bool { return p.UID == ref.UID }) {
			// A recorded pod whose controller changed: it was checked against the claim when
			// it joined, so no API call (a tenant may change its pod's owners at will).
			if err := d.state.AddPods(ctx, uid, []checkpoint.PodRef{ref}); err != nil {
				logger.Error(err, "Recording a pod's change of controller", "claim", klog.KRef(pod.Namespace, name), "pod", klog.KObj(pod))
			}
			continue
		}
		claim, err := d.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			logger.Error(err, "Reading a prepared claim to cap a pod that joined it", "claim", klog.KRef(pod.Namespace, name), "pod", klog.KObj(pod))
			continue
		}
		if string(claim.UID) != uid || !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
			return r.APIGroup == "" && r.Resource == "pods" && r.UID == pod.UID
		}) {
			continue
		}
		if err := d.state.AddPods(ctx, uid, []checkpoint.PodRef{ref}); err != nil {
			logger.Error(err, "Recording a pod that joined a prepared claim", "claim", klog.KObj(claim), "pod", klog.KObj(pod))
		}
	}
}

func (d *Driver) podEvent(ctx context.Context, ns string, pod checkpoint.PodRef, reason, msg string) {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod.Name, UID: types.UID(pod.UID)},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "fgpu-kubelet-plugin", Host: d.cfg.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := d.client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Recording a pod event", "pod", klog.KRef(ns, pod.Name), "reason", reason)
	}
}
