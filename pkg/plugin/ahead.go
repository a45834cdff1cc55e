package plugin

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// A namespace's first claim on a GPU needs an MPS daemon of its own, whose pod takes most of
// a second to start. The kubelet prepares a claim only after it mounted the pod's volumes,
// a few hundred milliseconds after the pod was bound; the daemon is started when the plugin
// sees the pod bound instead, so that its start and those mounts overlap. Only daemons no
// prepared claim uses are started ahead (one that died under claims is the prepare's and
// the MPS check's to restart and report), and one that no claim takes within aheadGrace
// (the pod went before its claim was prepared, or its prepare was refused) is stopped by
// the MPS check.

// aheadGrace is how long a daemon started ahead may wait for its claim's prepare.
const aheadGrace = time.Minute

// maxAheadPods bounds the pods remembered as looked at; past it the memory starts afresh
// (a pod looked at twice costs one claim read).
const maxAheadPods = 4096

// maxAheadLookups bounds the pods whose claims are being read at once, and maxAheadClaims
// the claims read for one pod: a tenant may bind pods naming many claims to this node by
// hand, and the plugin's API budget is every namespace's prepares'. Past them nothing is
// started ahead (the prepares start the daemons).
const (
	maxAheadLookups = 4
	maxAheadClaims  = 8
)

// startsAhead looks at each pod bound to this node once, while it is pending.
type startsAhead struct {
	mu      sync.Mutex
	seen    map[types.UID]bool
	lookups int
}

// podBound starts, in the background, the MPS daemons of the claims of a pod just bound to
// this node that are allocated here and reserved for it. The claim names in the pod are only
// candidates (a tenant writes spec.resourceClaims): the claim read from the API must list
// the pod's UID in status.reservedFor, which the scheduler writes.
func (d *Driver) podBound(ctx context.Context, pod *corev1.Pod) {
	if pod.Status.Phase != corev1.PodPending || pod.DeletionTimestamp != nil || len(pod.Spec.ResourceClaims) == 0 {
		return
	}
	a := &d.ahead
	a.mu.Lock()
	if a.seen[pod.UID] {
		a.mu.Unlock()
		return
	}
	if a.seen == nil || len(a.seen) >= maxAheadPods {
		a.seen = map[types.UID]bool{}
	}
	a.seen[pod.UID] = true
	if a.lookups >= maxAheadLookups {
		a.mu.Unlock()
		return
	}
	a.lookups++
	a.mu.Unlock()
	names := slices.Compact(slices.Sorted(slices.Values(claimNames(pod))))
	go func() {
		defer func() {
			a.mu.Lock()
			a.lookups--
			a.mu.Unlock()
		}()
		for _, name := range names[:min(len(names), maxAheadClaims)] {
			if uid, _ := d.state.preparedClaim(pod.Namespace, name); uid != "" {
				continue
			}
			claim, err := d.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil || !slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool {
				return r.APIGroup == "" && r.Resource == "pods" && r.UID == pod.UID
			}) {
				continue // the prepare reads it again and says what is wrong
			}
			d.state.startDaemonsAhead(ctx, claim)
		}
	}()
}

// startDaemonsAhead starts the MPS daemons claim will need that no prepared claim uses yet.
func (s *State) startDaemonsAhead(ctx context.Context, claim *resourceapi.ResourceClaim) {
	s.mu.Lock()
	defer s.unlock(ctx)
	if _, ok := s.cp.Claims[string(claim.UID)]; ok || !s.planner.allocatedHere(claim) {
		return
	}
	planned, err := s.planner.plan(claim)
	if err != nil {
		return // its prepare refuses it with the reason
	}
	s.daemons.startAhead(ctx, string(claim.UID), planned)
}

// startAhead starts the daemons of planned that no prepared claim uses and none is starting
// ahead already, while claim uid is not being prepared. While one starts, no new process on
// its GPU is judged foreign by the periodic refresh, and prepares on that GPU wait for it
// (startingOn): its server is fgpu's, known as such once the daemon was asked. Caller holds
// State's lock, which is released while a daemon starts.
func (d *daemons) startAhead(ctx context.Context, uid string, planned []checkpoint.PreparedDevice) {
	for _, p := range planned {
		// Read again each time: the lock was released while the previous one started.
		if _, ok := d.l.cp.Claims[uid]; ok {
			return
		}
		if p.MPSKey == "" || d.l.usedDaemons()[p.MPSKey] || d.foreign.starting[p.MPSKey] != "" {
			continue
		}
		done := make(chan struct{})
		d.foreign.starting[p.MPSKey] = p.GPUUUID
		d.aheadDone[p.MPSKey] = done
		d.ahead[p.MPSKey] = time.Now()
		_, err := d.ensure(ctx, p.MPSKey, p.GPUUUID, true)
		if err != nil {
			klog.FromContext(ctx).V(2).Info("Starting an MPS daemon ahead of its claim's prepare; the prepare starts it", "daemon", p.MPSKey, "err", err)
		}
		d.mu.Unlock()
		servers := d.foreign.serversOf(ctx, p.MPSKey)
		d.mu.Lock()
		d.foreign.own(servers)
		delete(d.foreign.starting, p.MPSKey)
		delete(d.aheadDone, p.MPSKey)
		close(done)
	}
}

// startingOn is closed once no daemon started ahead on the GPUs of planned is still
// starting; nil when none is. Caller holds State's lock.
func (d *daemons) startingOn(planned []checkpoint.PreparedDevice) <-chan struct{} {
	for key, uuid := range d.foreign.starting {
		if slices.ContainsFunc(planned, func(p checkpoint.PreparedDevice) bool { return p.GPUUUID == uuid }) {
			return d.aheadDone[key]
		}
	}
	return nil
}

// dropAhead has the daemons started ahead for planned, which a refused prepare does not
// take, stopped by the next MPS check unless a claim uses them by then.
func (d *daemons) dropAhead(planned []checkpoint.PreparedDevice) {
	for _, p := range planned {
		if _, ok := d.ahead[p.MPSKey]; ok {
			d.ahead[p.MPSKey] = time.Time{}
		}
	}
}

// expireAhead marks the daemons started ahead that no claim took within aheadGrace as
// still to be stopped. Caller holds State's lock.
func (d *daemons) expireAhead(now time.Time) {
	used := d.l.usedDaemons()
	for key, at := range d.ahead {
		switch {
		case used[key]:
			delete(d.ahead, key)
		case now.Sub(at) >= aheadGrace && d.foreign.starting[key] == "":
			delete(d.ahead, key)
			d.unstopped[key] = true
		}
	}
}

// claimNames are the claims a pod names: its own claims and those made for it from templates.
func claimNames(pod *corev1.Pod) []string {
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
	return names
}
