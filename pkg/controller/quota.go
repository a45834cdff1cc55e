package controller

import (
	"context"
	"fmt"
	"math"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

const (
	// reasonOverQuota is the rejection of a GPU that the claim's shares would put over quota
	// now: it fits once the namespace frees quota.
	reasonOverQuota = "over quota"
	// reasonBeyondQuota is the rejection of a GPU on which the claim's shares would exceed
	// the quota even with nothing else of the namespace in use.
	reasonBeyondQuota = "more than the namespace's whole quota"
	// reasonOverQuotaHeld is reasonOverQuota once the free room that the namespace's claims
	// keep from other namespaces counts (model.HeldRoom).
	reasonOverQuotaHeld = "over quota with the free room its namespace would keep from other namespaces, which counts on every GPU it keeps to itself but its roomiest"
	// reasonHeldRoomRefused is the rejection of a GPU on which the claim would make its
	// namespace keep free room from other namespaces on a GPU beyond its roomiest, which its
	// quota refuses (quota.heldRoom: Refuse).
	reasonHeldRoomRefused = "its namespace would keep free room from other namespaces on one more GPU, which its quota refuses (heldRoom: Refuse)"
)

// kueuePodSetLabel is what Kueue sets on the pods of a workload it admitted.
const kueuePodSetLabel = "kueue.x-k8s.io/podset"

// kueueHint says why a pod that Kueue admitted can still wait for quota: a SharingPolicy quota
// binds its namespace too, and Kueue has already spent its own quota on the pod. The label
// (which a tenant can write) only chooses the wording, never a decision.
func kueueHint(pods []*corev1.Pod) string {
	for _, p := range pods {
		if _, ok := p.Labels[kueuePodSetLabel]; ok {
			return "; Kueue admitted this pod, but a SharingPolicy quota binds its namespace too: where Kueue manages a namespace's GPU quota, unset the SharingPolicy quota or raise it to at least what the namespace's ClusterQueue can admit"
		}
	}
	return ""
}

// addSat adds two amounts, saturating at the int64 bounds: reserves are the tenant's to
// write, and a sum that wrapped negative would switch its namespace's quota off.
func addSat(a, b int64) int64 {
	switch {
	case b > 0 && a > math.MaxInt64-b:
		return math.MaxInt64
	case b < 0 && a < math.MinInt64-b:
		return math.MinInt64
	}
	return a + b
}

// overBy is how much need on top of used goes past limit (0 or less: within it), computed
// without overflow: used, which counts the reserves a tenant wrote, counts at most the limit.
func overBy(used, need, limit int64) int64 {
	return need - (limit - min(used, limit))
}

// use is what the claim's requests decided so far hold: the namespace's usage in the
// model counts them already, and the claim's next request must fit the quota with them.
// A bursting share is charged its cap (model.Tenant.Charge).
func (d *decision) use() model.Usage {
	var u model.Usage
	for _, r := range d.results {
		u.Mem += max(r.mem, r.burstCap)
		u.Comp += r.comp
	}
	return u
}

// quotaCheck checks a request against its namespace's quota before a GPU is chosen, with
// what is known then: the memory and compute asked, and for whole GPUs at least the
// smallest GPU's (the exact sizes are checked per GPU, by quotaFits). A request that
// would exceed the quota with nothing but its claim's earlier requests in use is refused:
// no quota freed would let it in, so it must not hold the namespace's quota queue.
func (dc *decider) quotaCheck(tx *model.Tx, in *input, d *decision, rq *request) *waitReason {
	p, q, ns := in.pol, in.pol.Quota, in.claim.Namespace
	if !q.Binds() {
		return nil
	}
	if q.Compute != nil && !rq.whole && uncappedCompute(p, rq) {
		// A share with no compute is charged 0% and its kernels are not capped: under a
		// compute quota it would use the GPU without counting against it.
		return &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf(
			"request %q asks for no compute, but namespace %s has a GPU compute quota (SharingPolicy %s: %d%%), and a share without compute runs uncapped and uncounted: ask for compute (e.g. compute: 10), or have the claim's policy (%s) set defaultCompute or computeFromMemory",
			rq.alt.name, ns, q.ComputeFrom, *q.Compute, p.DisplayName())}
	}
	own := d.use()
	need, compKnown := dc.leastNeed(tx, rq)
	what := dc.needText(tx, rq, need)
	ownMem, ownComp := "", ""
	if own.Mem > 0 {
		ownMem = fmt.Sprintf(" on top of the %s of its other requests", fmtBytes(own.Mem))
	}
	if own.Comp > 0 {
		ownComp = fmt.Sprintf(" on top of the %d%% of its other requests", own.Comp)
	}
	if q.Memory != nil {
		limit := q.Memory.Value()
		if overBy(own.Mem, need.Mem, limit) > 0 {
			return &waitReason{reason: ReasonOverQuota, beyondQuota: true, message: fmt.Sprintf(
				"larger than the GPU memory quota of namespace %s (SharingPolicy %s: %s): this claim needs %s%s; it will not be placed unless the quota is raised",
				ns, q.MemoryFrom, q.Memory.String(), what, ownMem)}
		}
		// Whole GPUs: their size is known per GPU only (quotaFits), and a lower bound that
		// queued the claim for quota could hold the namespace for a claim that never fits.
		if used := addSat(tx.Charged(ns).Mem, tx.Reserve(ns).Mem); !rq.whole && overBy(used, need.Mem, limit) > 0 {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU memory quota of namespace %s (SharingPolicy %s: %s): %s in use%s, this claim needs %s, %s over; it will be placed when quota frees up",
				ns, q.MemoryFrom, q.Memory.String(), fmtBytes(used), dc.reserveText(tx.Reserve(ns), fmtBytes(tx.Reserve(ns).Mem)), what, fmtBytes(overBy(used, need.Mem, limit)))}
		}
	}
	if q.Compute != nil && compKnown {
		limit := *q.Compute
		if overBy(own.Comp, need.Comp, limit) > 0 {
			return &waitReason{reason: ReasonOverQuota, beyondQuota: true, message: fmt.Sprintf(
				"larger than the GPU compute quota of namespace %s (SharingPolicy %s: %d%%): this claim needs %d%%%s; it will not be placed unless the quota is raised",
				ns, q.ComputeFrom, limit, need.Comp, ownComp)}
		}
		if used := addSat(tx.Charged(ns).Comp, tx.Reserve(ns).Comp); !rq.whole && overBy(used, need.Comp, limit) > 0 {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU compute quota of namespace %s (SharingPolicy %s: %d%%): %d%% in use%s, this claim needs %d%%, %d%% over; it will be placed when quota frees up",
				ns, q.ComputeFrom, limit, used, dc.reserveText(tx.Reserve(ns), fmt.Sprintf("%d%%", tx.Reserve(ns).Comp)), need.Comp, overBy(used, need.Comp, limit))}
		}
	}
	return nil
}

// claimQuotaCheck refuses a claim that needs more than its namespace's whole quota
// whichever alternatives it gets: a request of it that waited in the quota queue would
// hold the namespace's younger claims for ever.
func (dc *decider) claimQuotaCheck(ctx context.Context, tx *model.Tx, in *input, res *resolution) *waitReason {
	q, ns := in.pol.Quota, in.claim.Namespace
	if q.Invalid != nil {
		return &waitReason{reason: ReasonInvalidPolicy, message: q.Invalid.Error()}
	}
	if !q.Binds() {
		return nil
	}
	var least model.Usage
	memText, compText := "", ""
	reqs := in.claim.Spec.Devices.Requests
	for _, req := range reqs {
		alts := alternatives(req)
		var low *model.Usage
		for _, a := range alts {
			rq, w := res.request(a)
			if w != nil {
				continue // said when the request is decided
			}
			need, _ := dc.leastNeed(tx, rq)
			if low == nil {
				low = &need
			}
			low.Mem, low.Comp = min(low.Mem, need.Mem), min(low.Comp, need.Comp)
			if len(reqs) == 1 && len(alts) == 1 {
				memText, compText = dc.needText(tx, rq, need), fmt.Sprintf("%d%%", need.Comp)
			}
		}
		if low != nil {
			least.Mem, least.Comp = addSat(least.Mem, low.Mem), addSat(least.Comp, low.Comp)
		}
	}
	if memText == "" {
		memText, compText = "at least "+fmtBytes(least.Mem)+" in all", fmt.Sprintf("at least %d%% in all", least.Comp)
	}
	if q.Memory != nil && least.Mem > q.Memory.Value() {
		return &waitReason{reason: ReasonOverQuota, beyondQuota: true, message: fmt.Sprintf(
			"larger than the GPU memory quota of namespace %s (SharingPolicy %s: %s): this claim needs %s; it will not be placed unless the quota is raised",
			ns, q.MemoryFrom, q.Memory.String(), memText)}
	}
	if q.Compute != nil && least.Comp > *q.Compute {
		return &waitReason{reason: ReasonOverQuota, beyondQuota: true, message: fmt.Sprintf(
			"larger than the GPU compute quota of namespace %s (SharingPolicy %s: %d%%): this claim needs %s; it will not be placed unless the quota is raised",
			ns, q.ComputeFrom, *q.Compute, compText)}
	}
	return nil
}

// needText is a request's need of quota memory in words: "10Gi", or "4 whole GPU(s) of at
// least 80Gi" when the GPUs are not chosen yet.
func (dc *decider) needText(tx *model.Tx, rq *request, need model.Usage) string {
	if rq.whole {
		return fmt.Sprintf("%d whole GPU(s) of at least %s", rq.count, fmtBytes(tx.SmallestGPU().Mem))
	}
	return fmtBytes(need.Mem)
}

// leastNeed is the least that all of a request's devices take of the quota, whichever GPUs
// they get, and whether its compute is known before a GPU is chosen (not when it is
// derived from the GPU's memory).
func (dc *decider) leastNeed(tx *model.Tx, rq *request) (need model.Usage, compKnown bool) {
	if rq.whole {
		return model.Usage{Mem: rq.count * tx.SmallestGPU().Mem, Comp: rq.count * tx.SmallestGPU().Comp}, true
	}
	// A bursting share's cap is charged per GPU, bounded by the GPU (quotaFits): the least
	// is its guarantee.
	need.Mem = rq.mem * rq.count
	if rq.comp != nil {
		need.Comp, compKnown = *rq.comp*rq.count, true
	}
	return need, compKnown
}

// uncappedCompute reports whether a share gets no compute: none asked (or 0), and the
// policy derives none.
func uncappedCompute(p policy.Effective, rq *request) bool {
	if rq.comp != nil {
		return *rq.comp == 0
	}
	return !p.ComputeFromMemory && p.DefaultCompute == 0
}

// quotaFits says whether the request's devices keep the namespace within quota if each
// takes what GPU g would give it (mem, and its burst cap limit, and comp): "" if they do,
// else reasonOverQuota, reasonOverQuotaHeld, reasonHeldRoomRefused or reasonBeyondQuota.
// Counting every device at g's size keeps the claim within quota whichever GPUs the placement core picks for it: each
// passed with its own size times the count, so the sum of their sizes fits too. The room a
// device would keep from other namespaces on g counts too (model.HeldRoom): exactly for one
// device; for several, as if each kept g's room, as each GPU picked passed that way. The
// example says what the held room adds.
func (dc *decider) quotaFits(tx *model.Tx, in *input, own model.Usage, rq *request, g *model.GPU, mem, limit, comp int64) (string, string) {
	q, ns := in.pol.Quota, in.claim.Namespace
	if !q.Binds() && !q.RefuseHeldRoom {
		return "", ""
	}
	device := result{mem: mem, comp: comp, whole: rq.whole, mode: rq.mode, domain: rq.domain}
	if limit > mem {
		device.burstCap = limit
	}
	kept := g.KeptBy(ns, tenantOf(in, device))
	r := g.Room()
	r = model.Usage{Mem: max(r.Mem-limit, 0), Comp: max(r.Comp-comp, 0)}
	take := model.Usage{Mem: limit * rq.count, Comp: comp * rq.count}
	if over(q, own, take) {
		return reasonBeyondQuota, ""
	}
	if kept && rq.count > 1 {
		// Alone, its devices keep the room of every GPU they get but one.
		keep := model.Usage{Mem: (rq.count - 1) * r.Mem, Comp: (rq.count - 1) * r.Comp}
		if over(q, own, model.Usage{Mem: addSat(take.Mem, keep.Mem), Comp: addSat(take.Comp, keep.Comp)}) {
			return reasonBeyondQuota, fmt.Sprintf("on %s its %d devices would keep %s and %d%% free from other namespaces on every GPU but one",
				g.Key(), rq.count, fmtBytes(r.Mem), r.Comp)
		}
	}
	h := tx.Held(ns)
	held := h.Charge()
	switch was := h.Keeps(g); {
	case rq.count == 1:
		held = h.ChargeWith(g, r, kept)
	case kept && !was:
		held.Mem, held.Comp = addSat(held.Mem, rq.count*r.Mem), addSat(held.Comp, rq.count*r.Comp)
	}
	if q.RefuseHeldRoom {
		before := h.Charge()
		if kept && rq.count > 1 && (r.Mem > 0 || r.Comp > 0) {
			return reasonHeldRoomRefused, fmt.Sprintf("on %s its %d devices would keep %s and %d%% free from other namespaces on every GPU but one (SharingPolicy %s)",
				g.Key(), rq.count, fmtBytes(r.Mem), r.Comp, q.RefuseHeldRoomFrom)
		}
		if held.Mem > before.Mem || held.Comp > before.Comp {
			return reasonHeldRoomRefused, fmt.Sprintf("%s: namespace %s would keep %s and %d%% more free from others (SharingPolicy %s)",
				g.Key(), ns, fmtBytes(held.Mem-before.Mem), held.Comp-before.Comp, q.RefuseHeldRoomFrom)
		}
	}
	res := tx.Reserve(ns)
	used := model.Usage{Mem: addSat(tx.Charged(ns).Mem, res.Mem), Comp: addSat(tx.Charged(ns).Comp, res.Comp)}
	if over(q, used, take) {
		return reasonOverQuota, ""
	}
	if over(q, model.Usage{Mem: addSat(used.Mem, held.Mem), Comp: addSat(used.Comp, held.Comp)}, take) {
		if q.Memory != nil && overBy(addSat(used.Mem, held.Mem), take.Mem, q.Memory.Value()) > 0 {
			return reasonOverQuotaHeld, fmt.Sprintf("%s: namespace %s would hold %s and keep %s more free from others, over its %s quota",
				g.Key(), ns, fmtBytes(addSat(used.Mem, take.Mem)), fmtBytes(held.Mem), q.Memory.String())
		}
		return reasonOverQuotaHeld, fmt.Sprintf("%s: namespace %s would hold %d%% compute and keep %d%% more free from others, over its %d%% quota",
			g.Key(), ns, addSat(used.Comp, take.Comp), held.Comp, *q.Compute)
	}
	return "", ""
}

// over reports whether need on top of used goes past the quota, in memory or compute.
func over(q policy.Quota, used, need model.Usage) bool {
	return (q.Memory != nil && overBy(used.Mem, need.Mem, q.Memory.Value()) > 0) || (q.Compute != nil && overBy(used.Comp, need.Comp, *q.Compute) > 0)
}

// quotaText is a namespace's quota in words, with the policies it comes from:
// "SharingPolicy a: 80Gi memory, 50% compute" or "SharingPolicy a: 80Gi memory; SharingPolicy
// b: 50% compute".
func quotaText(q policy.Quota) string {
	var parts []string
	if q.Memory != nil {
		parts = append(parts, "SharingPolicy "+q.MemoryFrom+": "+q.Memory.String()+" memory")
	}
	if q.Compute != nil {
		c := fmt.Sprintf("%d%% compute", *q.Compute)
		if len(parts) == 1 && q.ComputeFrom == q.MemoryFrom {
			parts[0] += ", " + c
		} else {
			parts = append(parts, "SharingPolicy "+q.ComputeFrom+": "+c)
		}
	}
	return strings.Join(parts, "; ")
}
