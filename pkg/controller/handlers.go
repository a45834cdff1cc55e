package controller

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

func (c *Controller) onClaim(old, claim *resourceapi.ResourceClaim) {
	if !c.isOurs(claim) && claim.Status.Allocation == nil {
		return
	}
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	freed := c.account(claim)
	c.mu.Unlock()
	if freed {
		c.kick()
	}
	if c.isOurs(claim) {
		c.queue.Add(key)
	}
}

// account brings the state in line with a claim seen by the informer; it reports whether
// capacity was freed. Caller holds c.mu.
func (c *Controller) account(claim *resourceapi.ResourceClaim) bool {
	cur := c.st.claims[claimKey(claim)]
	if claim.Status.Allocation == nil {
		if cur == nil {
			return false
		}
		if !cur.assumed.IsZero() && c.now().Sub(cur.assumed) < 30*time.Second {
			return false // our own write, not yet seen by the informer
		}
		c.st.remove(claimKey(claim))
		return true
	}
	rec := c.recordFromClaim(claim)
	if rec == nil {
		return false
	}
	if cur != nil && sameShares(cur, rec) {
		cur.assumed = time.Time{}
		return false
	}
	c.st.add(rec)
	return cur != nil
}

func sameShares(a, b *claimRec) bool {
	if len(a.shares) != len(b.shares) {
		return false
	}
	for i := range a.shares {
		if a.shares[i].t.shareID != b.shares[i].t.shareID || a.shares[i].gpu != b.shares[i].gpu || a.shares[i].t.mem != b.shares[i].t.mem {
			return false
		}
	}
	return true
}

func (c *Controller) onClaimDelete(claim *resourceapi.ResourceClaim) {
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	freed := c.st.remove(claimKey(claim)) != nil
	delete(c.pending, key)
	delete(c.firstLook, key)
	delete(c.lastMsg, key)
	leftQueue := false
	if q := c.quotaWait[claim.Namespace]; q != nil {
		if _, ok := q[key]; ok {
			delete(q, key)
			leftQueue = true
		}
	}
	c.mu.Unlock()
	if freed {
		c.kick()
	}
	if leftQueue {
		c.requeueNamespace(claim.Namespace, key)
	}
}

// requeueNamespace looks again, oldest first, at a namespace's pending claims (one left
// the head of its quota queue).
func (c *Controller) requeueNamespace(ns, except string) {
	for _, k := range c.pendingInOrder(ns) {
		if k != except {
			c.queue.Add(k)
		}
	}
}

func (c *Controller) onSlices(node string) {
	objs, _ := c.slices.ByIndex(indexPodNode, node)
	devs := map[string]resourceapi.Device{}
	for _, o := range objs {
		s := o.(*resourceapi.ResourceSlice)
		if s.Spec.Driver != c.cfg.DriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			devs[d.Name] = d
		}
	}
	c.mu.Lock()
	c.st.setNodeDevices(node, devs)
	c.mu.Unlock()
	c.kick()
}

func (c *Controller) onPod(old, pod *corev1.Pod) {
	names := podClaimNames(pod)
	for _, o := range pod.OwnerReferences {
		_ = o
	}
	c.mu.Lock()
	c.trackBound(pod, false)
	if pod.Spec.NodeName != "" {
		c.dropAssumed(pod.UID)
	}
	c.mu.Unlock()
	if old != nil && podfit.Counts(old) && !podfit.Counts(pod) {
		c.kick() // the pod finished: its node's CPU and memory are free
	}
	for _, n := range names {
		c.queue.Add(pod.Namespace + "/" + n)
	}
	// Template claims: the claim is owned by the pod.
	if old == nil || len(old.Status.ResourceClaimStatuses) != len(pod.Status.ResourceClaimStatuses) {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				c.queue.Add(pod.Namespace + "/" + *s.ResourceClaimName)
			}
		}
	}
}

func (c *Controller) onPodDelete(pod *corev1.Pod) {
	c.mu.Lock()
	c.trackBound(pod, true)
	c.dropAssumed(pod.UID)
	delete(c.avoid, pod.UID)
	c.mu.Unlock()
	for _, n := range podClaimNames(pod) {
		c.queue.Add(pod.Namespace + "/" + n)
	}
	c.kick()
}

func (c *Controller) onPolicy(o any, deleted bool) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	c.mu.Lock()
	if deleted {
		delete(c.policies, u.GetName())
	} else {
		var p api.SharingPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err == nil {
			c.policies[p.Name] = &p
		}
	}
	c.mu.Unlock()
	c.kick()
}

// SetPolicy adds or replaces a policy directly (tests without a dynamic client).
func (c *Controller) SetPolicy(p *api.SharingPolicy) {
	c.mu.Lock()
	c.policies[p.Name] = p.DeepCopy()
	c.mu.Unlock()
	c.kick()
}

// consumers returns the pods that use a claim: by name in their spec or status, or as the
// claim's owner.
func (c *Controller) consumers(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	seen := map[types.UID]bool{}
	var out []*corev1.Pod
	objs, _ := c.podIndex.ByIndex(indexPodClaim, claim.Namespace+"/"+claim.Name)
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	for _, ref := range claim.OwnerReferences {
		if ref.Kind != "Pod" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		if p, err := c.pods.Pods(claim.Namespace).Get(ref.Name); err == nil && p.UID == ref.UID && !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	live := out[:0]
	for _, p := range out {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live = append(live, p)
		}
	}
	return live
}
