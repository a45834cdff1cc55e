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
// use (the median of its report intervals' peaks), which is what it consumes, what packing
// and quota count; and MPS caps it at burstCapFactor times the workload's observed peak. Caps
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
	workloads map[sizing.Workload]*sizing.Maxima
}

func newBurstHistory(clock sizing.Clock) *burstHistory {
	return &burstHistory{clock: clock, shares: map[string]*sizing.Maxima{}, workloads: map[sizing.Workload]*sizing.Maxima{}}
}

// record takes a share's usage summary for it and for its workload.
func (h *burstHistory) record(w sizing.Workload, share string, u sizing.Usage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range []*sizing.Maxima{h.shareMaxima(share), h.workloadMaxima(w)} {
		m.Record(h.clock, u.From, u.To, u.MemoryMaxBytes)
	}
}

func (h *burstHistory) shareMaxima(share string) *sizing.Maxima {
	m := h.shares[share]
	if m == nil {
		m = &sizing.Maxima{}
		h.shares[share] = m
	}
	return m
}

func (h *burstHistory) workloadMaxima(w sizing.Workload) *sizing.Maxima {
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
func (h *burstHistory) keepWorkloads(keep func(sizing.Workload) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for w := range h.workloads {
		if !keep(w) {
			delete(h.workloads, w)
		}
	}
}

// hasWorkload says whether w's use was recorded.
func (h *burstHistory) hasWorkload(w sizing.Workload) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.workloads[w]
	return ok
}

// admits says why GPU g cannot take a bursting share of workload w ("" if it can), at now.
// Each tenant counts, per interval, with its own recorded peak, else its workload's, else
// all it may use (its cap): a tenant the allocator knows nothing of since a restart counts
// whole. Caller holds the model's lock.
func (h *burstHistory) admits(g *gpu, w sizing.Workload, headroom float64, now time.Time) (string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	newcomer := h.workloads[w]
	to := h.clock.Interval(now)
	from := to - int64(h.clock.Window) + 1
	tenants := make([]func(int64) int64, 0, len(g.tenants))
	for _, t := range g.tenants {
		own, wl, all := h.shares[string(t.shareID)], h.workloads[t.workload], t.limit()
		tenants = append(tenants, func(k int64) int64 {
			if v, ok := own.At(k); ok {
				return v
			}
			if v, ok := wl.At(k); ok {
				return v
			}
			return all
		})
	}
	limit := int64(float64(g.memCap) / (1 + headroom))
	ok, over, need := sizing.Admit(limit, from, to, func(k int64) (int64, bool) { return newcomer.At(k) }, tenants)
	if ok {
		return "", ""
	}
	at := time.Unix(0, over*int64(h.clock.Width)).UTC().Format(time.RFC3339)
	return "its tenants' measured use and the workload's would not fit together",
		fmt.Sprintf("%s: %s in the interval from %s, %s admitted (%s less %.0f%% headroom)", g.key, fmtBytes(need), at, fmtBytes(limit), fmtBytes(g.memCap), headroom*100)
}

// latest is the peak of a share's newest recorded interval and the growth over the one before.
func (h *burstHistory) latest(share string) (peak, growth int64, ok bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := h.shares[share]
	k, ok := m.Newest()
	if !ok {
		return 0, 0, false
	}
	peak, _ = m.At(k)
	prev, had := m.At(k - 1)
	if !had {
		prev = peak
	}
	return peak, peak - prev, true
}

// limit is what a tenant may use: its burst cap, or what it holds.
func (t *tenant) limit() int64 {
	if t.burstCap > 0 {
		return t.burstCap
	}
	return t.mem
}

// burstSize sizes a request as a bursting share where it may burst: sizing Auto, best-effort,
// MPS, one share, on a GPU only its isolation domain uses, measured, with no memory limit of
// its own, in a pod its controller recreates (the only way a GPU that fills is relieved).
// guaranteed is what it consumes; capBytes what MPS lets it use, never more than the claim
// asks; zero where it does not burst.
func (c *Controller) burstSize(in *input, rq *request, w sizing.Workload, measured sizing.Recommendation, asked int64) (guaranteed, capBytes int64) {
	p := in.pol
	if p.Sizing != api.SizingAuto || p.Latency != api.LatencyBestEffort || p.AllowSharedGPU || p.Isolation == api.IsolationExclusive ||
		rq.mode != api.SharingModeMPS || rq.count != 1 || rq.userCfg.MemoryLimit != nil || c.cfg.isExclusiveClass(rq.alt.class) ||
		!recreatable(in.claim, in.consumers) || !c.burst.hasWorkload(w) {
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
	var sum int64
	move := -1
	for i := range tenants {
		peak, growth, ok := c.burst.latest(tenants[i].share)
		if !ok {
			continue
		}
		sum += peak
		tenants[i].growth = growth
		if move < 0 || growth > tenants[move].growth {
			move = i
		}
	}
	if move < 0 || float64(sum) <= autoNearCap*float64(memCap) {
		return "", "", ""
	}
	return tenants[move].key, tenants[move].share, fmt.Sprintf("the tenants of GPU %s/%s together used %s of its %s, and its use grew most (by %s); its controller recreates it where its workload's use fits",
		key.pool, key.device, fmtBytes(sum), fmtBytes(memCap), fmtBytes(max(0, tenants[move].growth)))
}

// sizeBurst makes a request a bursting share where burstSize allows it, and says so with
// what it asked.
func (c *Controller) sizeBurst(in *input, rq *request) {
	measured, ok := in.sized[rq.alt.name]
	if !ok || rq.whole || measured.ComputePercent >= busyComputePercent {
		return
	}
	asked := int64(0)
	if q, has := rq.alt.capacity[api.CapacityMemory]; has {
		asked = q.Value()
	}
	w := sizing.Workload{Namespace: in.sizedFor.Namespace, Kind: in.sizedFor.Kind, Name: in.sizedFor.Name, Request: rq.alt.name}
	guaranteed, capBytes := c.burstSize(in, rq, w, measured, asked)
	if capBytes == 0 {
		return
	}
	askedText := "a whole GPU"
	if asked > 0 {
		askedText = fmtBytes(asked)
	}
	rq.mem, rq.burstCap, rq.burstFor = guaranteed, capBytes, w
	rq.sized = fmt.Sprintf("request %q may burst (sizing Auto, best-effort, on a GPU only its isolation domain uses): guaranteed %s, the median of its report intervals' peaks, capped at %s, %d times the peak seen, from %d samples of %s %s/%s (asked %s)",
		rq.alt.name, fmtBytes(guaranteed), fmtBytes(capBytes), burstCapFactor, measured.Samples, w.Kind, w.Namespace, w.Name, askedText)
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
			if want.move == key {
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
	if len(pods) != 1 || pods[0].DeletionTimestamp != nil {
		return
	}
	pod := pods[0]
	if _, ok := a.wants[pod.UID]; ok {
		return
	}
	top := topOwner(pod)
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.ShareID != nil && string(*res.ShareID) == share {
			a.wants[pod.UID] = &resizeWant{pod: types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}, uid: pod.UID,
				w: sizing.Workload{Namespace: claim.Namespace, Kind: top.Kind, Name: top.Name, Request: res.Request}, claim: claim.Name, share: share,
				move: key, why: why, since: c.now()}
		}
	}
}
