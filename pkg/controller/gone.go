package controller

import (
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// goneClaims are claims deleted while pods still ran on their shares. The kubelet does not
// stop a pod whose claim is gone, so the GPU memory and compute stay in use: the model keeps
// the shares (and the namespace's quota usage) under a key no live claim has until those pods
// end. Admission refuses a tenant's removal of the finalizers that should prevent this; this
// covers a claim that went anyway (an older chart, an admin). It is the allocator's memory
// only: after a restart, nothing in the API shows these shares.
type goneClaims struct {
	mu sync.Mutex
	// byKey maps the model key a gone claim's shares are held under to the pods holding them.
	byKey map[string]map[types.UID]podRef

	listers  // the pods that may still run on a claim's shares
	model    *model.Model
	recorder record.EventRecorder
	// kick looks at the pending claims again (released shares free capacity and quota).
	kick func()
}

type podRef struct{ namespace, name string }

// heldKey is the model key of a gone claim's shares: never the key of a live claim, so a new
// claim of the same name is accounted on its own.
func heldKey(claim *resourceapi.ResourceClaim) string {
	return claimKey(claim) + "@" + string(claim.UID)
}

func (g *goneClaims) hold(key string, pods map[types.UID]podRef) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.byKey[key] = pods
}

// holding returns the gone claims a pod holds (nil if none).
func (g *goneClaims) holding(uid types.UID) map[string]map[types.UID]podRef {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out map[string]map[types.UID]podRef
	for k, pods := range g.byKey {
		if _, ok := pods[uid]; ok {
			if out == nil {
				out = map[string]map[types.UID]podRef{}
			}
			out[k] = pods
		}
	}
	return out
}

func (g *goneClaims) all() map[string]map[types.UID]podRef {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]map[types.UID]podRef, len(g.byKey))
	for k, pods := range g.byKey {
		out[k] = pods
	}
	return out
}

func (g *goneClaims) drop(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.byKey, key)
}

// holdsShare reports whether a pod may still run on a claim's devices: not finished, and not
// a deleted pod that never reached a node (kube-controller-manager keeps a reservation by the
// same rule).
func holdsShare(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return false
	}
	return p.DeletionTimestamp == nil || p.Spec.NodeName != ""
}

// runningOn returns the pods that may still run on a claim's devices: those in its
// reservedFor, and those bound to a node that use it.
func (g *goneClaims) runningOn(claim *resourceapi.ResourceClaim) map[types.UID]podRef {
	out := map[types.UID]podRef{}
	for _, r := range claim.Status.ReservedFor {
		if r.APIGroup != "" || r.Resource != "pods" {
			continue
		}
		if p, err := g.pods.Pods(claim.Namespace).Get(r.Name); err == nil && p.UID == r.UID && holdsShare(p) {
			out[p.UID] = podRef{p.Namespace, p.Name}
		}
	}
	for _, p := range g.claimPods(claim) {
		if p.Spec.NodeName != "" && holdsShare(p) {
			out[p.UID] = podRef{p.Namespace, p.Name}
		}
	}
	return out
}

// holdIfRunning keeps the shares of a claim deleted while pods still run on them; it
// reports whether it did.
func (g *goneClaims) holdIfRunning(claim *resourceapi.ResourceClaim) bool {
	pods := g.runningOn(claim)
	if len(pods) == 0 || !g.model.Rekey(claimKey(claim), heldKey(claim)) {
		return false
	}
	g.hold(heldKey(claim), pods)
	names := make([]string, 0, len(pods))
	for _, p := range pods {
		names = append(names, p.name)
	}
	klog.Background().Info("Claim deleted while pods still run on its GPU shares; keeping the shares and quota usage until they end",
		"claim", klog.KObj(claim), "pods", names)
	msg := fmt.Sprintf("claim %s was deleted while this pod still runs on its GPU share; fgpu keeps the share and its namespace's quota usage until the pod ends", claim.Name)
	for _, p := range pods {
		if pod, err := g.pods.Pods(p.namespace).Get(p.name); err == nil {
			g.recorder.Event(pod, corev1.EventTypeWarning, ReasonClaimDeletedInUse, msg)
		}
	}
	return true
}

// recheck releases the shares of gone claims none of whose pods run any more; only the
// gone claims pod holds (nil: every gone claim) are looked at.
func (g *goneClaims) recheck(pod *corev1.Pod) {
	held := g.all()
	if pod != nil {
		held = g.holding(pod.UID)
	}
	for key, pods := range held {
		running := false
		for uid, ref := range pods {
			if p, err := g.pods.Pods(ref.namespace).Get(ref.name); err == nil && p.UID == uid && holdsShare(p) {
				running = true
				break
			}
		}
		if running {
			continue
		}
		g.drop(key)
		if g.model.Release(key) {
			klog.Background().Info("Pods of a deleted claim ended; released its GPU shares", "claim", key)
			g.kick()
		}
	}
}
