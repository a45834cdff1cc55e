package controller

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// Consolidation (sizing Auto, the burst model). A bursting share is placed where its
// workload's use fits when its pod starts, but pods come and go, and GPUs empty unevenly: a
// GPU left with one or two bursting tenants holds a whole GPU for them while other GPUs of
// their isolation domain have room. Each report interval Auto looks for a GPU whose bursting
// tenants would each be placed, one per GPU, on another GPU already in use (the same checks
// as placing their pods anew: nodes, selectors, taints, quota, co-tenancy and burst
// admission). It marks that GPU draining, so no bursting share is placed there, and evicts
// its tenants' pods as any resize (one pod of a workload at a time, PodDisruptionBudgets
// hold), so that their controllers recreate them where their workloads' use fits. One GPU
// drains at a time across the cluster; a drain whose tenants stop fitting elsewhere ends.
// Which GPU, in which order, and for how long are pkg/sizing/engine's; this file asks the
// placement path where each tenant would go, and queues the evictions.

// drainMove is a tenant of a GPU to drain, and the GPU it would be placed on.
type drainMove struct {
	pod   *corev1.Pod
	claim string
	share string
	w     api.SizingWorkload
	to    model.GPUKey
}

// consolidate runs every report interval: it ends a drain that is done, stuck, or whose
// tenants stopped fitting elsewhere, and otherwise starts one where a GPU can be emptied.
func (s *sizingLoop) consolidate(ctx context.Context) {
	if s.fenced() != nil {
		return
	}
	now := s.now()
	if key, since, ok := s.burst.Draining(); ok {
		if now.Sub(since) >= engine.DrainGiveUp {
			// Left alone for as long, so that one GPU's pods that cannot move (a
			// PodDisruptionBudget that allows nothing) do not hold every other drain.
			s.endDrain(key, now.Add(engine.DrainGiveUp))
			return
		}
		if s.drainGoesOn(ctx, key, since, now) {
			return
		}
		s.endDrain(key, time.Time{})
	}
	for _, key := range s.drainCandidates(now) {
		if moves, ok := s.drainMoves(ctx, key); ok && len(moves) > 0 {
			s.startDrain(ctx, key, moves, now)
			return
		}
	}
}

// drainCandidates are the GPUs whose tenants all burst, those guaranteed least first, but
// those whose drain gave up lately.
func (s *sizingLoop) drainCandidates(now time.Time) []model.GPUKey {
	var all []engine.Candidate[model.GPUKey]
	s.model.EachGPU(func(g *model.GPU) {
		if g.NumTenants() > 0 && !s.burst.IsDraining(g.Key()) && !s.burst.Resting(g.Key(), now) && allBurst(g) {
			all = append(all, engine.Candidate[model.GPUKey]{GPU: g.Key(), Guaranteed: g.UsedMem()})
		}
	})
	// The engine keeps the given order among GPUs guaranteed as much: by name, so that a
	// pass is the same whatever the map's order.
	slices.SortFunc(all, func(a, b engine.Candidate[model.GPUKey]) int { return cmp.Compare(a.GPU.String(), b.GPU.String()) })
	return engine.Candidates(all)
}

// isPodOwned: the claim is a pod's own, from a template; it is deleted with its pod.
func isPodOwned(claim *resourceapi.ResourceClaim) bool {
	own := metav1.GetControllerOf(claim)
	return own != nil && own.Kind == "Pod"
}

func sameDomain(g *model.GPU, d model.Domain) bool {
	for t := range g.Tenants() {
		if t.Domain != d {
			return false
		}
	}
	return true
}

func allBurst(g *model.GPU) bool {
	for t := range g.Tenants() {
		if t.BurstCap == 0 {
			return false
		}
	}
	return true
}

// drainMoves finds, for each tenant of GPU key that is not on its way out, another GPU in
// use that its pod, placed anew, would be placed on, one tenant per GPU; ok is false where
// one has none, or would not come back bursting, or nothing would recreate it.
func (s *sizingLoop) drainMoves(ctx context.Context, key model.GPUKey) ([]drainMove, bool) {
	tenants, _, _ := s.model.GPUTenants(key)
	var stays []drainStay
	for _, t := range tenants {
		claim, leaving := s.tenantClaim(t)
		if leaving {
			continue
		}
		if claim == nil {
			return nil, false
		}
		pods := s.claimPods(claim)
		if len(pods) == 0 && isPodOwned(claim) {
			continue // its pod is gone (evicted): the claim goes with it
		}
		// A claim with more devices is placed again whole, on one node: the one share
		// checked here says too little.
		if !recreatable(claim, pods) || len(claim.Status.Allocation.Devices.Results) != 1 {
			return nil, false
		}
		if pods[0].DeletionTimestamp != nil {
			continue
		}
		in, ok := s.gather(ctx, claim)
		if !ok {
			return nil, false
		}
		if in.pol.Quota.Binds() {
			if _, queued := s.pending.QuotaAhead(claim.Namespace, "", s.now()); queued {
				return nil, false // what the evicted pod frees would go to the claims queued first
			}
		}
		// Placed anew, as its recreated pod would be: on any node its pod fits.
		in.bound, in.conflict, in.reservedFor, in.pods = "", nil, nil, in.consumers
		st := drainStay{shareID: t.ShareID, claim: claim, pod: pods[0], in: in}
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.ShareID != nil && *r.ShareID == t.ShareID {
				st.request = r.Request
			}
		}
		stays = append(stays, st)
	}
	if len(stays) == 0 {
		return nil, true
	}
	var to []*model.GPU
	ok := false
	s.model.Update(func(tx *model.Tx) { to, ok = s.moveTargets(ctx, tx, key, stays) })
	if !ok {
		return nil, false
	}
	moves := make([]drainMove, 0, len(stays))
	for i, st := range stays {
		top := topOwner(st.pod)
		moves = append(moves, drainMove{pod: st.pod, claim: st.claim.Name, share: string(st.shareID), to: to[i].Key(),
			w: api.SizingWorkload{Namespace: st.claim.Namespace, Kind: top.Kind, Name: top.Name, Request: st.request}})
	}
	return moves, true
}

// drainStay is a tenant of a GPU to drain that is not on its way out: it must be placed
// elsewhere.
type drainStay struct {
	shareID types.UID
	claim   *resourceapi.ResourceClaim
	pod     *corev1.Pod
	request string
	in      *input
}

// moveTargets finds, for each of stays (tenants of GPU key), another GPU in use that its
// pod, placed anew, would be placed on, one tenant per GPU; ok is false where one has none.
func (s *sizingLoop) moveTargets(ctx context.Context, tx *model.Tx, key model.GPUKey, stays []drainStay) ([]*model.GPU, bool) {
	g, ok := tx.GPU(key)
	if !ok || tx.EnsureCore(s.place.schedPolicy, s.place) != nil {
		return nil, false
	}
	var dom model.Domain
	for t := range g.Tenants() {
		dom = t.Domain
	}
	// Only a GPU of bursting shares of the same isolation domain can take one (coTenancy):
	// the others are not worth a node check.
	var others []*model.GPU
	for h := range tx.GPUs() {
		if _, _, inCore := h.Core(); inCore && h != g && h.NumTenants() > 0 && allBurst(h) && sameDomain(h, dom) {
			others = append(others, h)
		}
	}
	slices.SortFunc(others, func(a, b *model.GPU) int { return cmp.Compare(a.KeyText(), b.KeyText()) })
	// Each tenant's recreated request is asked of the placement path as a new pod's would be.
	// The namespace's quota counts the share it replaces too: a ReplicaSet creates the new pod
	// while the evicted one still holds its claim.
	fits := make([]func(node, index int) bool, len(stays))
	for i, st := range stays {
		rq := s.recreated(ctx, tx, st.in, st.request)
		if g.Tenant(st.shareID) == nil || rq == nil {
			return nil, false
		}
		cons, _ := claimConstraints(st.in.claim)
		fits[i] = s.place.gpuFilter(ctx, tx, st.in, &decision{}, rq, forAlt(cons, st.request, nil, s.cfg.DriverName), &rejects{})
	}
	return engine.Assign(len(stays), others, func(i int, h *model.GPU) bool {
		ni, gi, _ := h.Core()
		return fits[i](ni, gi)
	})
}

// tenantClaim is a tenant's claim; leaving is true where it is gone or going (its shares are
// released soon).
func (s *sizingLoop) tenantClaim(t *model.Tenant) (claim *resourceapi.ResourceClaim, leaving bool) {
	claim, err := s.claims.ResourceClaims(t.Namespace).Get(strings.TrimPrefix(t.Key, t.Namespace+"/"))
	if err != nil || claim.DeletionTimestamp != nil || claim.Status.Allocation == nil {
		return nil, true
	}
	return claim, false
}

// recreated is request's resolved alternative as a recreated pod's claim would get it, if
// it would burst (nil otherwise).
func (s *sizingLoop) recreated(ctx context.Context, tx *model.Tx, in *input, request string) *request {
	for _, r := range in.claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if a.name != request {
				continue
			}
			rq, w := resolveRequest(s.cfg, in, a, s.place.smallestGPU(tx, in))
			if w != nil || !s.sizeBurst(in, rq) {
				return nil
			}
			return rq
		}
	}
	return nil
}

// startDrain marks GPU key draining and asks Auto to recreate its tenants' pods.
func (s *sizingLoop) startDrain(ctx context.Context, key model.GPUKey, moves []drainMove, now time.Time) {
	s.burst.SetDraining(key, now)
	s.wantMoves(key, now, moves, now)
	klog.FromContext(ctx).Info("Emptying a GPU whose bursting tenants fit on GPUs in use", "gpu", key, "tenants", len(moves))
}

// wantMoves asks Auto to recreate the pods of moves, off GPU key, if the drain of key that
// began at since still goes on (an eviction may have ended it meanwhile).
func (s *sizingLoop) wantMoves(key model.GPUKey, since time.Time, moves []drainMove, now time.Time) {
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	if k, at, ok := s.burst.Draining(); !ok || k != key || !at.Equal(since) {
		return
	}
	a := s.sizer.auto
	for _, m := range moves {
		if _, ok := a.wants[m.pod.UID]; ok {
			continue // recreated anyway; its new pod is not placed on a draining GPU
		}
		a.wants[m.pod.UID] = &resizeWant{pod: types.NamespacedName{Namespace: m.pod.Namespace, Name: m.pod.Name}, uid: m.pod.UID, w: m.w,
			claim: m.claim, share: m.share, move: key, drain: true, since: now,
			why: fmt.Sprintf("GPU %s's bursting tenants each fit on another GPU in use (this one on %s), where their workloads' use fits; sizing Auto empties %s to give it back, and its controller recreates the pod there",
				key, m.to, key)}
	}
}

// drainGoesOn says whether the drain of GPU key goes on: it still has tenants, and those not
// on their way out still fit elsewhere; one whose eviction was dropped (it had another want
// that went, or the informer had not shown it leaving yet) is asked for again.
func (s *sizingLoop) drainGoesOn(ctx context.Context, key model.GPUKey, since, now time.Time) bool {
	if tenants, _, _ := s.model.GPUTenants(key); len(tenants) == 0 {
		return false
	}
	moves, ok := s.drainMoves(ctx, key)
	if ok {
		s.wantMoves(key, since, moves, now)
	}
	return ok
}

// endDrain ends the drain of GPU key and drops the evictions it still waits for; the GPU is
// not drained again before restUntil.
func (s *sizingLoop) endDrain(key model.GPUKey, restUntil time.Time) {
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	s.endDrainLocked(key, restUntil)
}

// endDrainLocked is endDrain with the sizer's lock held.
func (s *sizingLoop) endDrainLocked(key model.GPUKey, restUntil time.Time) {
	s.burst.ClearDraining(key, s.now(), restUntil)
	for uid, want := range s.sizer.auto.wants {
		if want.drain && want.move == key {
			delete(s.sizer.auto.wants, uid)
		}
	}
}
