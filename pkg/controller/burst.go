package controller

import (
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// The burst model (sizing Auto, best-effort): a share is guaranteed its workload's typical
// use (the median of its report intervals' peaks), which is what it consumes and what
// packing counts; MPS caps it at burstCapFactor times the workload's observed peak, which
// is what the quota charges (tenant.charge). Caps
// on one GPU may then add up to more than the GPU: a GPU admits a bursting share only where
// its tenants' measured use, interval by interval over the window, plus the newcomer's
// workload's, fits the GPU less headroom. Only a GPU that one isolation domain holds, and
// that holds no share that does not burst, takes bursting shares: a burst can only ever
// crowd the same team's best-effort work, which chose Auto.

// burstCapFactor: a bursting share is capped at this multiple of its workload's observed
// peak (docs/sizing.md measures 1.5 against 2).
const burstCapFactor = 2

// burstHistory keeps, per share and per workload under sizing Auto, the peak of each report
// interval: what admission sums in time. Its lock is a leaf: nothing else is locked while it
// is held, so the placement path may ask it under the model's lock.
type burstHistory struct {
	mu        sync.Mutex
	clock     sizing.Clock
	shares    map[string]*sizing.Maxima
	workloads map[api.SizingWorkload]*sizing.Maxima
	// since is when each workload first had burstMinIntervals recorded.
	since map[api.SizingWorkload]time.Time
	// drain is the GPU consolidation empties, since drainSince (zero key: none): no bursting
	// share is placed there.
	drain      gpuKey
	drainSince time.Time
	// rest: GPUs whose drain gave up or was refused, and until when they are left alone.
	rest map[gpuKey]time.Time
}

func (h *burstHistory) draining() (gpuKey, time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.drain, h.drainSince, h.drain != (gpuKey{})
}

func (h *burstHistory) isDraining(k gpuKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.drain != (gpuKey{}) && h.drain == k
}

func (h *burstHistory) setDraining(k gpuKey, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.drain, h.drainSince = k, now
}

// clearDraining ends the drain of k (if it is the one) and leaves k alone until restUntil
// (zero: not); rests over by now are forgotten, so a GPU gone since is not kept.
func (h *burstHistory) clearDraining(k gpuKey, now, restUntil time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.drain == k {
		h.drain, h.drainSince = gpuKey{}, time.Time{}
	}
	for g, until := range h.rest {
		if !now.Before(until) {
			delete(h.rest, g)
		}
	}
	if !restUntil.IsZero() {
		if h.rest == nil {
			h.rest = map[gpuKey]time.Time{}
		}
		h.rest[k] = restUntil
	}
}

func (h *burstHistory) resting(k gpuKey, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	until, ok := h.rest[k]
	if ok && !now.Before(until) {
		delete(h.rest, k)
		return false
	}
	return ok
}

func newBurstHistory(clock sizing.Clock) *burstHistory {
	return &burstHistory{clock: clock, shares: map[string]*sizing.Maxima{}, workloads: map[api.SizingWorkload]*sizing.Maxima{}, since: map[api.SizingWorkload]time.Time{}}
}

// record takes a share's usage summary for it and for its workload, at now on the
// allocator's clock.
func (h *burstHistory) record(w api.SizingWorkload, share string, u api.ShareUsage, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if newest, _, ok := h.workloads[w].Newest(); ok && h.clock.Interval(u.From)-newest > int64(h.clock.Window) {
		delete(h.since, w) // back after a pause longer than the window: measured anew
	}
	for _, m := range []*sizing.Maxima{h.shareMaxima(share), h.workloadMaxima(w)} {
		m.Record(h.clock, u.From, u.To, u.MemoryMaxBytes)
	}
	if _, ok := h.since[w]; !ok && h.workloads[w].Known() >= burstMinIntervals {
		h.since[w] = now
	}
}

// measuredSince is when w first had burstMinIntervals recorded (zero: not yet).
func (h *burstHistory) measuredSince(w api.SizingWorkload) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.since[w]
}

func (h *burstHistory) shareMaxima(share string) *sizing.Maxima {
	m := h.shares[share]
	if m == nil {
		m = &sizing.Maxima{}
		h.shares[share] = m
	}
	return m
}

func (h *burstHistory) workloadMaxima(w api.SizingWorkload) *sizing.Maxima {
	m := h.workloads[w]
	if m == nil {
		m = &sizing.Maxima{}
		h.workloads[w] = m
	}
	return m
}

func (h *burstHistory) forgetShare(share string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.shares, share)
}

// keepWorkloads forgets the workloads keep says no.
func (h *burstHistory) keepWorkloads(keep func(api.SizingWorkload) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.workloads {
		if !keep(w) {
			delete(h.workloads, w)
			delete(h.since, w)
		}
	}
}

// burstMinIntervals: a workload is admitted by its history once it recorded this many
// report intervals (half an hour at the default 5 minutes, as the recommender's minimum of
// samples): fewer say too little about when its peaks come, and each interval more keeps
// every new workload on the whole GPUs it asked for longer (docs/sizing.md measures both).
const burstMinIntervals = 6

// measured says whether w's use is recorded for burstMinIntervals, the newest within the
// window before now: a workload back after a longer pause, or switched to Auto, is placed per
// claim until it has reported again.
func (h *burstHistory) measured(w api.SizingWorkload, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.workloads[w]
	newest, _, ok := m.Newest()
	return ok && newest > h.clock.Interval(now)-int64(h.clock.Window) && m.Known() >= burstMinIntervals
}

// admits says why GPU g cannot take a bursting share of workload w ("" if it can), at now.
// The newcomer counts as sizing.Expected says, the tenants as sizing.Counted says, with all
// they may use (their caps) where nothing is known: a tenant the allocator knows nothing of
// since a restart counts whole. Caller holds the model's lock.
func (h *burstHistory) admits(g *gpu, w api.SizingWorkload, headroom float64, now time.Time) (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	to := h.clock.Interval(now)
	from := to - int64(h.clock.Window) + 1
	tenants := make([]func(int64) int64, 0, len(g.tenants))
	for _, t := range g.tenants {
		tenants = append(tenants, sizing.Counted(h.shares[string(t.shareID)], h.workloads[t.workload], t.limit()))
	}
	limit := int64(float64(g.memCap) / (1 + headroom))
	ok, over, need := sizing.Admit(limit, from, to, sizing.Expected(h.workloads[w]), tenants)
	if ok {
		return "", ""
	}
	at := time.Unix(0, over*int64(h.clock.Width)).UTC().Format(time.RFC3339)
	return "its tenants' measured use and the workload's would not fit together",
		fmt.Sprintf("%s: %.1fGi in the interval from %s, %.1fGi admitted (%s less %.0f%% headroom)", g.key, gib(need), at, gib(limit), fmtBytes(g.memCap), headroom*100)
}

// newest is the newest interval any of these shares recorded.
func (h *burstHistory) newest(shares []string) (k int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range shares {
		if n, _, has := h.shares[s].Newest(); has && (!ok || n > k) {
			k, ok = n, true
		}
	}
	return k, ok
}

// useAt is a share's use in intervals k and k-1 as admission counts it (sizing.Counted; 0
// where nothing is known).
func (h *burstHistory) useAt(share string, k int64) (cur, prev int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	counted := sizing.Counted(h.shares[share], nil, 0)
	return counted(k), counted(k - 1)
}

// limit is what a tenant may use: its burst cap, or what it holds.
func (t *tenant) limit() int64 {
	if t.burstCap > 0 {
		return t.burstCap
	}
	return t.mem
}

// charge is what a tenant counts against its namespace's memory quota: a bursting share its
// cap, not the guarantee that packing counts. Its GPU is closed to other namespaces, and a
// share guaranteed little (its use mostly low, with peaks) could otherwise hold GPU after
// GPU under a small quota.
func (t *tenant) charge() int64 { return t.limit() }

// burstSize sizes a request as a bursting share where it may burst: sizing Auto, best-effort,
// MPS, one share, on a GPU only its isolation domain uses, measured, with no memory limit of
// its own, in a pod its controller recreates (the only way a GPU that fills is relieved).
// guaranteed is what it consumes; capBytes what MPS lets it use, never more than the claim
// asks; zero where it does not burst.
func (c *Controller) burstSize(in *input, rq *request, w api.SizingWorkload, measured api.SizingRecommendation, asked int64) (guaranteed, capBytes int64) {
	p := in.pol
	if p.Sizing != api.SizingAuto || p.Latency != api.LatencyBestEffort || p.AllowSharedGPU || p.Isolation == api.IsolationExclusive ||
		rq.mode != api.SharingModeMPS || rq.count != 1 || rq.userCfg.MemoryLimit != nil || c.cfg.isExclusiveClass(rq.alt.class) ||
		!recreatable(in.claim, in.consumers) || !c.burst.measured(w, c.now()) {
		return 0, 0
	}
	guaranteed = max(sizing.MemoryStep, measured.TypicalBytes)
	capBytes = roundUp(int64(float64(measured.PeakBytes)*burstCapFactor), sizing.MemoryStep)
	if asked > 0 {
		guaranteed, capBytes = min(guaranteed, asked), min(capBytes, asked)
	}
	if capBytes <= guaranteed {
		return 0, 0
	}
	return guaranteed, capBytes
}

// recreatable: the claim is its pod's own (from a template), and a ReplicaSet or StatefulSet
// recreates the pod: Auto can then move it off a GPU that fills.
func recreatable(claim *resourceapi.ResourceClaim, consumers []*corev1.Pod) bool {
	if len(consumers) != 1 {
		return false
	}
	pod := consumers[0]
	own, ctl := metav1.GetControllerOf(claim), metav1.GetControllerOf(pod)
	return own != nil && own.Kind == "Pod" && own.UID == pod.UID && ctl != nil && (ctl.Kind == "ReplicaSet" || ctl.Kind == "StatefulSet")
}

// overfull is the bursting tenant to move off GPU key, where its tenants' newest interval
// peaks together pass autoNearCap of its memory: the one that grew most. Caller holds
// neither the model's nor the sizer's lock.
func (c *Controller) overfull(key gpuKey) (claimKey, share, why string) {
	type seen struct {
		share  string
		key    string
		growth int64
	}
	var tenants []seen
	var memCap int64
	c.model.mu.Lock()
	if g, ok := c.model.gpus[key]; ok && g.known {
		memCap = g.memCap
		for _, t := range g.tenants {
			if t.burstCap == 0 {
				c.model.mu.Unlock()
				return "", "", ""
			}
			tenants = append(tenants, seen{share: string(t.shareID), key: t.key})
		}
	}
	c.model.mu.Unlock()
	if len(tenants) < 2 {
		return "", "", ""
	}
	// Judged at the GPU's newest reported interval, every tenant at its use there (its
	// newest report where it wrote none since), grown over the interval before.
	shares := make([]string, len(tenants))
	for i := range tenants {
		shares[i] = tenants[i].share
	}
	k, ok := c.burst.newest(shares)
	if !ok {
		return "", "", ""
	}
	var sum int64
	move := -1
	for i := range tenants {
		cur, prev := c.burst.useAt(tenants[i].share, k)
		sum += cur
		tenants[i].growth = cur - prev
		if move < 0 || tenants[i].growth > tenants[move].growth {
			move = i
		}
	}
	if float64(sum) <= autoNearCap*float64(memCap) {
		return "", "", ""
	}
	return tenants[move].key, tenants[move].share, fmt.Sprintf("the tenants of GPU %s/%s together used %s of its %s, and its use grew most (by %s); its controller recreates it where its workload's use fits",
		key.pool, key.device, fmtBytes(sum), fmtBytes(memCap), fmtBytes(max(0, tenants[move].growth)))
}

// sizeBurst makes a request a bursting share where burstSize allows it, and says so with
// what it asked; it reports whether it did.
func (c *Controller) sizeBurst(in *input, rq *request) bool {
	measured, ok := in.sized[rq.alt.name]
	if !ok || rq.whole || measured.ComputePercent >= busyComputePercent {
		return false
	}
	asked := int64(0)
	if q, has := rq.alt.capacity[api.CapacityMemory]; has {
		asked = q.Value()
	}
	w := api.SizingWorkload{Namespace: in.sizedFor.Namespace, Kind: in.sizedFor.Kind, Name: in.sizedFor.Name, Request: rq.alt.name}
	guaranteed, capBytes := c.burstSize(in, rq, w, measured, asked)
	if capBytes == 0 {
		return false
	}
	askedText := "a whole GPU"
	if asked > 0 {
		askedText = fmtBytes(asked)
	}
	rq.mem, rq.burstCap, rq.burstFor = guaranteed, capBytes, w
	rq.sized = fmt.Sprintf("request %q may burst (sizing Auto, best-effort, on a GPU only its isolation domain uses): guaranteed %s, the median of its report intervals' peaks, capped at %s, %d times the peak seen, from %d samples of %s %s/%s (asked %s)",
		rq.alt.name, fmtBytes(guaranteed), fmtBytes(capBytes), burstCapFactor, measured.Samples, w.Kind, w.Namespace, w.Name, askedText)
	return true
}

// relieve asks Auto to move the bursting tenant that grew most off GPU key, where its
// tenants' newest reports together near its memory; and drops such a want once they do not.
func (c *Controller) relieve(key gpuKey) {
	claimKey, share, why := c.overfull(key)
	c.sizer.mu.Lock()
	defer c.sizer.mu.Unlock()
	a := c.sizer.auto
	if claimKey == "" {
		for uid, want := range a.wants {
			if want.move == key && !want.drain {
				delete(a.wants, uid)
			}
		}
		return
	}
	ns, name, _ := strings.Cut(claimKey, "/")
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if err != nil || claim.Status.Allocation == nil {
		return
	}
	pods := c.claimPods(claim)
	if !recreatable(claim, pods) || pods[0].DeletionTimestamp != nil {
		return // nothing would bring it back
	}
	pod := pods[0]
	if _, ok := a.wants[pod.UID]; ok {
		return
	}
	top := topOwner(pod)
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.ShareID != nil && string(*res.ShareID) == share {
			a.wants[pod.UID] = &resizeWant{pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, uid: pod.UID,
				w: api.SizingWorkload{Namespace: claim.Namespace, Kind: top.Kind, Name: top.Name, Request: res.Request}, claim: claim.Name, share: share,
				move: key, why: why, since: c.now()}
		}
	}
}

// shouldBurst says whether a running share that does not burst would burst if placed again
// now: its pod was placed before its workload was measured, under MPS or holding a whole
// GPU it asked for, with no memory limit of its own, and its workload's use is neither busy
// (it keeps its whole GPU) nor idle (time-slicing). A pod placed since, that still does not
// burst, had a reason not to: it is never recreated for this. Caller holds the sizer's lock.
func (c *Controller) shouldBurst(claim *resourceapi.ResourceClaim, r autoReport, rec api.SizingRecommendation, capBytes, gpuMem int64) bool {
	since := c.burst.measuredSince(r.w)
	at := claim.Status.Allocation.AllocationTimestamp
	if since.IsZero() || at == nil || !at.Time.Before(since) || !c.burst.measured(r.w, c.now()) {
		return false
	}
	cfg := allocationConfig(c.cfg.DriverName, claim.Status.Allocation.Devices.Config, r.result.Request)
	if cfg.MemoryLimit != nil || cfg.Mode == api.SharingModeTimeSlicing || c.cfg.isExclusiveClass(c.classOfRequest(claim, r.result.Request)) {
		return false
	}
	shares := 0
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Request == r.result.Request {
			shares++
		}
	}
	// A request for several devices, or for a whole GPU that its recommendation fills
	// (applySizing keeps it whole), would come back the same.
	if shares != 1 || askedMemory(claim, r.result.Request) == 0 && gpuMem > 0 && rec.MemoryBytes >= gpuMem {
		return false
	}
	guaranteed := max(sizing.MemoryStep, rec.TypicalBytes)
	return rec.ComputePercent < busyComputePercent && rec.ComputePercent > idleComputePercent && guaranteed < capBytes &&
		guaranteed < roundUp(int64(float64(rec.PeakBytes)*burstCapFactor), sizing.MemoryStep)
}

// gib is a measured or derived byte count in GiB, as a person reads it.
func gib(b int64) float64 { return float64(b) / (1 << 30) }
