// Package podledger is what the pods bound and assumed on each node request, for node fit.
package podledger

import (
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// Ledger keeps what pods ask of each node, for the allocator's pod-fit checks: pods bound
// to a node, pods the allocator pinned to a node through an allocation that the scheduler
// has not bound yet (assumed), and the nodes where a pod's allocation timed out.
// The per-node sums make a decision's pod-fit check O(1) per node instead of a walk over
// every pod.
type Ledger struct {
	mu        sync.Mutex
	assumed   map[types.UID]podOnNode
	bound     map[types.UID]podOnNode
	assumedOn map[string]podfit.Requests
	boundOn   map[string]podfit.Requests
	avoid     map[types.UID]map[string]bool
	// changed are the nodes whose sums (or Node object, NodeChanged) changed since
	// TakeChanged: the placement core refreshes only those.
	changed map[string]struct{}
}

type podOnNode struct {
	node string
	req  podfit.Requests
	at   time.Time // when it was assumed
}

// New is an empty ledger.
func New() *Ledger {
	return &Ledger{assumed: map[types.UID]podOnNode{}, bound: map[types.UID]podOnNode{},
		assumedOn: map[string]podfit.Requests{}, boundOn: map[string]podfit.Requests{}, avoid: map[types.UID]map[string]bool{},
		changed: map[string]struct{}{}}
}

// Assume records that the allocator pinned pods to a node.
func (l *Ledger) Assume(pods []*corev1.Pod, node string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pods {
		l.dropAssumed(p.UID)
		a := podOnNode{node: node, req: podfit.PodRequests(p), at: at}
		l.assumed[p.UID] = a
		addOnNode(l.assumedOn, node, a.req)
		l.changed[node] = struct{}{}
	}
}

// Drop forgets pods the allocator pinned (their allocation was not written or was taken back).
func (l *Ledger) Drop(pods []*corev1.Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pods {
		l.dropAssumed(p.UID)
	}
}

func (l *Ledger) dropAssumed(uid types.UID) {
	a, ok := l.assumed[uid]
	if !ok {
		return
	}
	delete(l.assumed, uid)
	subOnNode(l.assumedOn, a.node, a.req)
	l.changed[a.node] = struct{}{}
}

// Bound brings a pod's entry in line with the informer: a pod on a node counts there while
// it runs (no longer as assumed); deleted, or finished, it counts nowhere.
func (l *Ledger) Bound(pod *corev1.Pod, deleted bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b, ok := l.bound[pod.UID]; ok {
		subOnNode(l.boundOn, b.node, b.req)
		delete(l.bound, pod.UID)
		l.changed[b.node] = struct{}{}
	}
	if pod.Spec.NodeName != "" || deleted {
		l.dropAssumed(pod.UID)
	}
	if deleted {
		delete(l.avoid, pod.UID)
		return
	}
	if !podfit.Counts(pod) {
		return
	}
	b := podOnNode{node: pod.Spec.NodeName, req: podfit.PodRequests(pod)}
	l.bound[pod.UID] = b
	addOnNode(l.boundOn, b.node, b.req)
	l.changed[b.node] = struct{}{}
}

// NodeChanged records that a Node object changed (its allocatable may have).
func (l *Ledger) NodeChanged(node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.changed[node] = struct{}{}
}

// TakeChanged returns the nodes changed since the last call, and forgets them.
func (l *Ledger) TakeChanged() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.changed) == 0 {
		return nil
	}
	out := make([]string, 0, len(l.changed))
	for n := range l.changed {
		out = append(out, n)
	}
	// A new map, not clear: a map keeps the size it grew to (every node, at startup),
	// and walking or clearing it would cost that size at every decision.
	l.changed = map[string]struct{}{}
	return out
}

// Requested sums what bound and assumed pods ask of a node, except the pods being placed.
func (l *Ledger) Requested(node string, except []*corev1.Pod) podfit.Requests {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.boundOn[node]
	r.Add(l.assumedOn[node])
	for _, p := range except {
		if b, ok := l.bound[p.UID]; ok && b.node == node {
			r.Sub(b.req)
		}
		if a, ok := l.assumed[p.UID]; ok && a.node == node {
			r.Sub(a.req)
		}
	}
	return r
}

// Avoid records that the pods' allocation on node timed out: they are not placed there again.
func (l *Ledger) Avoid(pods []*corev1.Pod, node string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range pods {
		if l.avoid[p.UID] == nil {
			l.avoid[p.UID] = map[string]bool{}
		}
		l.avoid[p.UID][node] = true
		l.dropAssumed(p.UID)
	}
}

// Avoided lists the nodes any of the pods must avoid.
func (l *Ledger) Avoided(pods []*corev1.Pod) map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]bool{}
	for _, p := range pods {
		for n := range l.avoid[p.UID] {
			out[n] = true
		}
	}
	return out
}

// Expire forgets pods assumed before a time: their pods were neither bound nor deleted
// while the allocator watched (a missed event), and must not hold node capacity forever.
func (l *Ledger) Expire(before time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for uid, a := range l.assumed {
		if a.at.Before(before) {
			l.dropAssumed(uid)
		}
	}
}

// addOnNode and subOnNode keep a per-node sum of requests, without entries for nodes
// whose sum is back to zero.
func addOnNode(m map[string]podfit.Requests, node string, req podfit.Requests) {
	r := m[node]
	r.Add(req)
	m[node] = r
}

func subOnNode(m map[string]podfit.Requests, node string, req podfit.Requests) {
	r := m[node]
	r.Sub(req)
	if r == (podfit.Requests{}) {
		delete(m, node)
	} else {
		m[node] = r
	}
}
