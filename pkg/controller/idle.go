package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

const (
	// ReasonScaledToZero is the event on a workload the allocator scaled to zero.
	ReasonScaledToZero = "FgpuScaledToZero"
	// idleInterval is how often idle workloads are scaled and woken ones' annotations dropped.
	idleInterval = 30 * time.Second
)

// workloadRef names a Deployment or StatefulSet.
type workloadRef struct{ namespace, kind, name string }

// idleScaler scales idle workloads to zero (the policy's IdleScaleDown, a workload's
// opt-in) and keeps the quota reserve of those scaled to zero in the model. It keeps, per
// share, since when all its usage reports were idle (the engine's rule), in memory, under
// its lock: a new leader starts from the reports it reads, so it may scale late, never
// early. Its lock is a leaf: the model's is never taken under it.
type idleScaler struct {
	mu    sync.Mutex
	spans *engine.Idle[workloadRef]

	cfg *Config // the controller's, as New completed it
	listers
	model    *model.Model // nsReserve: what workloads scaled to zero keep of their namespace's quota
	client   kubernetes.Interface
	recorder record.EventRecorder
	// fenced says why the allocator may not write now (nil: it may): no scaling then.
	fenced func() error
	// kick looks at the pending claims again (a reserve released frees quota).
	kick func()
}

// observeIdle takes a claim's usage reports into the idle tracker when the policy of its
// pods scales idle Deployments or StatefulSets down: a report counts as idle when it has SM
// samples and its highest SM activity is below the policy's bound.
func (sc *idleScaler) observeIdle(claim *resourceapi.ResourceClaim) {
	if claim.Status.Allocation == nil {
		return
	}
	pods := sc.claimPods(claim)
	if len(pods) == 0 {
		return
	}
	top := topOwner(pods[0])
	w := workloadRef{claim.Namespace, top.Kind, top.Name}
	bound := sc.policyOf(claim.Namespace, pods[0]).IdleScaleDown
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.Driver != sc.cfg.DriverName || st.Data == nil || st.ShareID == nil || allocatedRequest(claim.Status.Allocation, st) == "" {
			continue
		}
		id := *st.ShareID
		if bound == nil || (w.kind != "Deployment" && w.kind != "StatefulSet") {
			sc.spans.Forget(id)
			continue
		}
		var data api.DeviceStatusData
		if json.Unmarshal(st.Data.Raw, &data) != nil || data.Usage == nil {
			continue
		}
		sc.spans.Observe(id, w, *data.Usage, int(bound.SMBelowPercent))
	}
}

// forgetIdle drops a deleted claim's shares from the idle tracker.
func (sc *idleScaler) forgetIdle(claim *resourceapi.ResourceClaim) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.ShareID != nil {
			sc.spans.Forget(*st.ShareID)
		}
	}
}

// idleWorkload is a workload found idle: its claims and what they hold.
type idleWorkload struct {
	obj      runtime.Object
	meta     metav1.Object
	replicas int32
	reserve  model.Usage
	shares   []string
	after    time.Duration
}

// scaleIdle scales to zero the opted-in workloads whose every claim was idle for its
// policy's IdleScaleDown.After, and drops the scale-down annotations of the workloads that
// have replicas again. Fenced like every other write of the allocator.
func (sc *idleScaler) scaleIdle(ctx context.Context) {
	if sc.fenced() != nil {
		return
	}
	sc.dropWokenAnnotations(ctx)
	sc.mu.Lock()
	candidates := sc.spans.Workloads()
	sc.mu.Unlock()
	for w := range candidates {
		if iw := sc.idleWorkload(w); iw != nil {
			sc.scaleToZero(ctx, w, iw)
		}
	}
}

// idleWorkload returns the workload if it opted in, has replicas, and every fgpu share of
// every pod of it has been idle for its policy's After; nil otherwise.
func (sc *idleScaler) idleWorkload(w workloadRef) *idleWorkload {
	iw := &idleWorkload{}
	switch w.kind {
	case "Deployment":
		d, err := sc.deployments.Deployments(w.namespace).Get(w.name)
		if err != nil {
			return nil
		}
		iw.obj, iw.meta, iw.replicas = d, d, ptr.Deref(d.Spec.Replicas, 1)
	case "StatefulSet":
		s, err := sc.statefulsets.StatefulSets(w.namespace).Get(w.name)
		if err != nil {
			return nil
		}
		iw.obj, iw.meta, iw.replicas = s, s, ptr.Deref(s.Spec.Replicas, 1)
	default:
		return nil
	}
	if iw.meta.GetAnnotations()[api.AnnotationIdleScaleDown] != "true" || iw.replicas == 0 {
		return nil
	}
	pods, err := sc.pods.Pods(w.namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	sc.mu.Lock()
	defer sc.mu.Unlock()
	for _, p := range pods {
		if top := topOwner(p); top.Kind != w.kind || top.Name != w.name {
			continue
		}
		for _, name := range podClaimNames(p) {
			claim, err := sc.claims.ResourceClaims(w.namespace).Get(name)
			if err != nil || seen[name] || !sc.cfg.isOurs(claim) {
				continue
			}
			seen[name] = true
			if claim.Status.Allocation == nil {
				return nil // a claim still to be placed is not idle
			}
			pol := sc.policyOf(claim.Namespace, p).IdleScaleDown
			if pol == nil {
				return nil
			}
			iw.after = max(iw.after, pol.After.Duration)
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != sc.cfg.DriverName || r.ShareID == nil {
					continue
				}
				if !sc.spans.IdleFor(string(*r.ShareID), w, pol.After.Duration) {
					return nil
				}
				iw.shares = append(iw.shares, string(*r.ShareID))
				if q, ok := r.ConsumedCapacity[api.CapacityMemory]; ok {
					// What the quota charges: a bursting share its cap.
					charged := q.Value()
					if pl := model.AllocationConfig(sc.cfg.DriverName, claim.Status.Allocation.Devices.Config, r.Request).Placement; pl != nil && pl.MemoryLimit != nil {
						charged = max(charged, pl.MemoryLimit.Value())
					}
					iw.reserve.Mem += charged
				}
				if q, ok := r.ConsumedCapacity[api.CapacityCompute]; ok {
					iw.reserve.Comp += q.Value()
				}
			}
		}
	}
	if len(iw.shares) == 0 {
		return nil
	}
	return iw
}

// scaleToZero records the replicas and the reserve on the workload (guarded by the
// resourceVersion it was found idle at), tells it in an event, and scales it to zero
// through its scale subresource.
func (sc *idleScaler) scaleToZero(ctx context.Context, w workloadRef, iw *idleWorkload) {
	logger := klog.FromContext(ctx)
	reserve, _ := json.Marshal(api.IdleReserve{Memory: *resource.NewQuantity(iw.reserve.Mem, resource.BinarySI), Compute: iw.reserve.Comp})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": iw.meta.GetResourceVersion(),
		"annotations": map[string]string{
			api.AnnotationScaledDownReplicas: strconv.Itoa(int(iw.replicas)),
			api.AnnotationScaledDownReserve:  string(reserve),
		}}})
	scale := []byte(`{"spec":{"replicas":0}}`)
	var err error
	switch w.kind {
	case "Deployment":
		if _, err = sc.client.AppsV1().Deployments(w.namespace).Patch(ctx, w.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			_, err = sc.client.AppsV1().Deployments(w.namespace).Patch(ctx, w.name, types.MergePatchType, scale, metav1.PatchOptions{}, "scale")
		}
	case "StatefulSet":
		if _, err = sc.client.AppsV1().StatefulSets(w.namespace).Patch(ctx, w.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			_, err = sc.client.AppsV1().StatefulSets(w.namespace).Patch(ctx, w.name, types.MergePatchType, scale, metav1.PatchOptions{}, "scale")
		}
	}
	if err != nil {
		logger.Error(err, "Scaling an idle workload to zero", "kind", w.kind, "workload", klog.KRef(w.namespace, w.name))
		return
	}
	sc.mu.Lock()
	for _, id := range iw.shares {
		sc.spans.Forget(id)
	}
	sc.mu.Unlock()
	sc.recorder.Eventf(iw.obj, corev1.EventTypeNormal, ReasonScaledToZero,
		"scaled from %d replicas to zero: its GPU use was idle for %s; it keeps %s of GPU memory and %d%% compute of namespace %s's quota until it has replicas again (fgpu wake %s/%s -n %s)",
		iw.replicas, iw.after, fmtBytes(iw.reserve.Mem), iw.reserve.Comp, w.namespace, kindArg(w.kind), w.name, w.namespace)
}

func kindArg(kind string) string {
	if kind == "StatefulSet" {
		return "statefulset"
	}
	return "deployment"
}

// dropWokenAnnotations removes the scale-down annotations of every workload that has
// replicas again, whoever scaled it up: its reserve is released.
func (sc *idleScaler) dropWokenAnnotations(ctx context.Context) {
	drop := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}}}`, api.AnnotationScaledDownReplicas, api.AnnotationScaledDownReserve))
	deps, _ := sc.deployments.List(labels.Everything())
	for _, d := range deps {
		if woken(d, d.Spec.Replicas) {
			if _, err := sc.client.AppsV1().Deployments(d.Namespace).Patch(ctx, d.Name, types.MergePatchType, drop, metav1.PatchOptions{}); err != nil {
				klog.FromContext(ctx).Error(err, "Dropping the scale-down annotations of a woken workload", "deployment", klog.KObj(d))
			}
		}
	}
	sets, _ := sc.statefulsets.List(labels.Everything())
	for _, s := range sets {
		if woken(s, s.Spec.Replicas) {
			if _, err := sc.client.AppsV1().StatefulSets(s.Namespace).Patch(ctx, s.Name, types.MergePatchType, drop, metav1.PatchOptions{}); err != nil {
				klog.FromContext(ctx).Error(err, "Dropping the scale-down annotations of a woken workload", "statefulset", klog.KObj(s))
			}
		}
	}
}

func woken(m metav1.Object, replicas *int32) bool {
	a := m.GetAnnotations()
	_, r := a[api.AnnotationScaledDownReplicas]
	_, q := a[api.AnnotationScaledDownReserve]
	return (r || q) && ptr.Deref(replicas, 1) > 0
}

// reserveOf is what a workload scaled to zero keeps of its namespace's quota: its reserve
// annotation while it has no replicas. The tenant can edit it, so a value that does not
// parse or is negative counts as nothing: a reserve can only add to what its own namespace
// holds. A huge one is summed with saturation and counts at most the quota's limit in the
// quota checks (overBy), so it cannot wrap around and free the quota either.
func reserveOf(m metav1.Object, replicas *int32) model.Usage {
	raw, ok := m.GetAnnotations()[api.AnnotationScaledDownReserve]
	if !ok || ptr.Deref(replicas, 1) != 0 {
		return model.Usage{}
	}
	var r api.IdleReserve
	if json.Unmarshal([]byte(raw), &r) != nil {
		return model.Usage{}
	}
	return model.Usage{Mem: max(r.Memory.Value(), 0), Comp: max(r.Compute, 0)}
}

// onWorkload recomputes the quota reserve of a Deployment's or StatefulSet's namespace,
// and places claims again when it changed (a reserve released frees quota).
func (sc *idleScaler) onWorkload(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	ns := m.GetNamespace()
	var sum model.Usage
	deps, _ := sc.deployments.Deployments(ns).List(labels.Everything())
	for _, d := range deps {
		r := reserveOf(d, d.Spec.Replicas)
		sum.Mem, sum.Comp = addSat(sum.Mem, r.Mem), addSat(sum.Comp, r.Comp)
	}
	sets, _ := sc.statefulsets.StatefulSets(ns).List(labels.Everything())
	for _, s := range sets {
		r := reserveOf(s, s.Spec.Replicas)
		sum.Mem, sum.Comp = addSat(sum.Mem, r.Mem), addSat(sum.Comp, r.Comp)
	}
	if sc.model.SetReserve(ns, sum) {
		sc.kick()
	}
}

// reserveText says, in a quota message, how much of what is in use is kept for workloads
// scaled to zero, where the namespace keeps reserve for them.
func (sc *idleScaler) reserveText(reserve model.Usage, amount string) string {
	if reserve == (model.Usage{}) {
		return ""
	}
	return " (" + amount + " of it kept for workloads scaled to zero)"
}
