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
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
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

// idleTracker keeps, per share, since when all its usage reports were idle (the engine's
// rule), in memory: a new leader starts from the reports it reads, so it may scale late,
// never early.
type idleTracker struct {
	mu    sync.Mutex
	spans *engine.Idle[workloadRef]
}

func newIdleTracker() *idleTracker { return &idleTracker{spans: engine.NewIdle[workloadRef]()} }

// observeIdle takes a claim's usage reports into the idle tracker when the policy of its
// pods scales idle Deployments or StatefulSets down: a report counts as idle when it has SM
// samples and its highest SM activity is below the policy's bound.
func (c *Controller) observeIdle(claim *resourceapi.ResourceClaim) {
	if claim.Status.Allocation == nil {
		return
	}
	pods := c.claimPods(claim)
	if len(pods) == 0 {
		return
	}
	top := topOwner(pods[0])
	w := workloadRef{claim.Namespace, top.Kind, top.Name}
	bound := c.policyOf(claim, pods[0]).IdleScaleDown
	c.idle.mu.Lock()
	defer c.idle.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.Driver != c.cfg.DriverName || st.Data == nil || st.ShareID == nil || allocatedRequest(claim.Status.Allocation, st) == "" {
			continue
		}
		id := *st.ShareID
		if bound == nil || (w.kind != "Deployment" && w.kind != "StatefulSet") {
			c.idle.spans.Forget(id)
			continue
		}
		var data api.DeviceStatusData
		if json.Unmarshal(st.Data.Raw, &data) != nil || data.Usage == nil {
			continue
		}
		c.idle.spans.Observe(id, w, *data.Usage, int(bound.SMBelowPercent))
	}
}

// forgetIdle drops a deleted claim's shares from the idle tracker.
func (c *Controller) forgetIdle(claim *resourceapi.ResourceClaim) {
	c.idle.mu.Lock()
	defer c.idle.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.ShareID != nil {
			c.idle.spans.Forget(*st.ShareID)
		}
	}
}

// idleWorkload is a workload found idle: its claims and what they hold.
type idleWorkload struct {
	obj      runtime.Object
	meta     metav1.Object
	replicas int32
	reserve  usage
	shares   []string
	after    time.Duration
}

// scaleIdle scales to zero the opted-in workloads whose every claim was idle for its
// policy's IdleScaleDown.After, and drops the scale-down annotations of the workloads that
// have replicas again. Fenced like every other write of the allocator.
func (c *Controller) scaleIdle(ctx context.Context) {
	if c.fenced() != nil {
		return
	}
	c.dropWokenAnnotations(ctx)
	c.idle.mu.Lock()
	candidates := c.idle.spans.Workloads()
	c.idle.mu.Unlock()
	for w := range candidates {
		if iw := c.idleWorkload(w); iw != nil {
			c.scaleToZero(ctx, w, iw)
		}
	}
}

// idleWorkload returns the workload if it opted in, has replicas, and every fgpu share of
// every pod of it has been idle for its policy's After; nil otherwise.
func (c *Controller) idleWorkload(w workloadRef) *idleWorkload {
	iw := &idleWorkload{}
	switch w.kind {
	case "Deployment":
		d, err := c.deployments.Deployments(w.namespace).Get(w.name)
		if err != nil {
			return nil
		}
		iw.obj, iw.meta, iw.replicas = d, d, ptr.Deref(d.Spec.Replicas, 1)
	case "StatefulSet":
		s, err := c.statefulsets.StatefulSets(w.namespace).Get(w.name)
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
	pods, err := c.pods.Pods(w.namespace).List(labels.Everything())
	if err != nil {
		return nil
	}
	seen := map[string]bool{}
	c.idle.mu.Lock()
	defer c.idle.mu.Unlock()
	for _, p := range pods {
		if top := topOwner(p); top.Kind != w.kind || top.Name != w.name {
			continue
		}
		for _, name := range podClaimNames(p) {
			claim, err := c.claims.ResourceClaims(w.namespace).Get(name)
			if err != nil || seen[name] || !c.cfg.isOurs(claim) {
				continue
			}
			seen[name] = true
			if claim.Status.Allocation == nil {
				return nil // a claim still to be placed is not idle
			}
			pol := c.policyOf(claim, p).IdleScaleDown
			if pol == nil {
				return nil
			}
			iw.after = max(iw.after, pol.After.Duration)
			for _, r := range claim.Status.Allocation.Devices.Results {
				if r.Driver != c.cfg.DriverName || r.ShareID == nil {
					continue
				}
				if !c.idle.spans.IdleFor(string(*r.ShareID), w, pol.After.Duration) {
					return nil
				}
				iw.shares = append(iw.shares, string(*r.ShareID))
				if q, ok := r.ConsumedCapacity[api.CapacityMemory]; ok {
					// What the quota charges: a bursting share its cap.
					charged := q.Value()
					if pl := allocationConfig(c.cfg.DriverName, claim.Status.Allocation.Devices.Config, r.Request).Placement; pl != nil && pl.MemoryLimit != nil {
						charged = max(charged, pl.MemoryLimit.Value())
					}
					iw.reserve.mem += charged
				}
				if q, ok := r.ConsumedCapacity[api.CapacityCompute]; ok {
					iw.reserve.comp += q.Value()
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
func (c *Controller) scaleToZero(ctx context.Context, w workloadRef, iw *idleWorkload) {
	logger := klog.FromContext(ctx)
	reserve, _ := json.Marshal(api.IdleReserve{Memory: *resource.NewQuantity(iw.reserve.mem, resource.BinarySI), Compute: iw.reserve.comp})
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
		if _, err = c.client.AppsV1().Deployments(w.namespace).Patch(ctx, w.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			_, err = c.client.AppsV1().Deployments(w.namespace).Patch(ctx, w.name, types.MergePatchType, scale, metav1.PatchOptions{}, "scale")
		}
	case "StatefulSet":
		if _, err = c.client.AppsV1().StatefulSets(w.namespace).Patch(ctx, w.name, types.MergePatchType, patch, metav1.PatchOptions{}); err == nil {
			_, err = c.client.AppsV1().StatefulSets(w.namespace).Patch(ctx, w.name, types.MergePatchType, scale, metav1.PatchOptions{}, "scale")
		}
	}
	if err != nil {
		logger.Error(err, "Scaling an idle workload to zero", "kind", w.kind, "workload", klog.KRef(w.namespace, w.name))
		return
	}
	c.idle.mu.Lock()
	for _, id := range iw.shares {
		c.idle.spans.Forget(id)
	}
	c.idle.mu.Unlock()
	c.recorder.Eventf(iw.obj, corev1.EventTypeNormal, ReasonScaledToZero,
		"scaled from %d replicas to zero: its GPU use was idle for %s; it keeps %s of GPU memory and %d%% compute of namespace %s's quota until it has replicas again (fgpu wake %s/%s -n %s)",
		iw.replicas, iw.after, fmtBytes(iw.reserve.mem), iw.reserve.comp, w.namespace, kindArg(w.kind), w.name, w.namespace)
}

func kindArg(kind string) string {
	if kind == "StatefulSet" {
		return "statefulset"
	}
	return "deployment"
}

// dropWokenAnnotations removes the scale-down annotations of every workload that has
// replicas again, whoever scaled it up: its reserve is released.
func (c *Controller) dropWokenAnnotations(ctx context.Context) {
	drop := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:null,%q:null}}}`, api.AnnotationScaledDownReplicas, api.AnnotationScaledDownReserve))
	deps, _ := c.deployments.List(labels.Everything())
	for _, d := range deps {
		if woken(d, d.Spec.Replicas) {
			if _, err := c.client.AppsV1().Deployments(d.Namespace).Patch(ctx, d.Name, types.MergePatchType, drop, metav1.PatchOptions{}); err != nil {
				klog.FromContext(ctx).Error(err, "Dropping the scale-down annotations of a woken workload", "deployment", klog.KObj(d))
			}
		}
	}
	sets, _ := c.statefulsets.List(labels.Everything())
	for _, s := range sets {
		if woken(s, s.Spec.Replicas) {
			if _, err := c.client.AppsV1().StatefulSets(s.Namespace).Patch(ctx, s.Name, types.MergePatchType, drop, metav1.PatchOptions{}); err != nil {
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
func reserveOf(m metav1.Object, replicas *int32) usage {
	raw, ok := m.GetAnnotations()[api.AnnotationScaledDownReserve]
	if !ok || ptr.Deref(replicas, 1) != 0 {
		return usage{}
	}
	var r api.IdleReserve
	if json.Unmarshal([]byte(raw), &r) != nil {
		return usage{}
	}
	return usage{mem: max(r.Memory.Value(), 0), comp: max(r.Compute, 0)}
}

// onWorkload recomputes the quota reserve of a Deployment's or StatefulSet's namespace,
// and places claims again when it changed (a reserve released frees quota).
func (c *Controller) onWorkload(obj any) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	ns := m.GetNamespace()
	var sum usage
	deps, _ := c.deployments.Deployments(ns).List(labels.Everything())
	for _, d := range deps {
		r := reserveOf(d, d.Spec.Replicas)
		sum.mem, sum.comp = addSat(sum.mem, r.mem), addSat(sum.comp, r.comp)
	}
	sets, _ := c.statefulsets.StatefulSets(ns).List(labels.Everything())
	for _, s := range sets {
		r := reserveOf(s, s.Spec.Replicas)
		sum.mem, sum.comp = addSat(sum.mem, r.mem), addSat(sum.comp, r.comp)
	}
	c.model.mu.Lock()
	changed := c.model.nsReserve[ns] != sum
	if sum == (usage{}) {
		delete(c.model.nsReserve, ns)
	} else {
		c.model.nsReserve[ns] = sum
	}
	c.model.mu.Unlock()
	if changed {
		c.kick()
	}
}

// reserveText says, in a quota message, how much of what is in use is kept for workloads
// scaled to zero. Caller holds the model's lock.
func (c *Controller) reserveText(ns, amount string) string {
	if c.model.nsReserve[ns] == (usage{}) {
		return ""
	}
	return " (" + amount + " of it kept for workloads scaled to zero)"
}
