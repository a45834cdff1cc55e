package controller

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// The burst model (sizing Auto, best-effort; its rules are pkg/sizing/engine's, which `fgpu
// sim sizing` replays): a share is guaranteed its workload's typical use (the median of its
// report intervals' peaks), which is what it consumes and what packing counts; MPS caps it at
// engine.CapFactor times the workload's observed peak, which is what the quota charges
// (model.Tenant.Charge). Caps
// on one GPU may then add up to more than the GPU: a GPU admits a bursting share only where
// its tenants' measured use, interval by interval over the window, plus the newcomer's
// workload's, fits the GPU less headroom. Only a GPU that one isolation domain holds, and
// that holds no share that does not burst, takes bursting shares: a burst can only ever
// crowd the same team's best-effort work, which chose Auto.

// burstAdmits says why GPU g cannot take a bursting share of workload w ("" if it can), at
// now, as the engine's admission judges it: a tenant the allocator knows nothing of since a
// restart counts whole (its cap). Called inside a model transaction.
func burstAdmits(h *engine.History[model.GPUKey], g *model.GPU, w api.SizingWorkload, headroom float64, now time.Time) (string, string) {
	tenants := make([]engine.Tenant, 0, g.NumTenants())
	for t := range g.Tenants() {
		tenants = append(tenants, engine.Tenant{Share: string(t.ShareID), Workload: t.Workload, Limit: t.Limit()})
	}
	r := h.Admits(g.MemCap(), tenants, w, headroom, now)
	if r == nil {
		return "", ""
	}
	return "its tenants' measured use and the workload's would not fit together",
		fmt.Sprintf("%s: %.1fGi in the interval from %s, %.1fGi admitted (%s less %.0f%% headroom)", g.Key(), gib(r.Need), r.At.Format(time.RFC3339), gib(r.Limit), fmtBytes(g.MemCap()), headroom*100)
}

// burstSize sizes a request as a bursting share where it may burst: sizing Auto, best-effort,
// MPS, one share, on a GPU only its isolation domain uses, measured, with no memory limit of
// its own, in a pod its controller recreates (the only way a GPU that fills is relieved).
// guaranteed is what it consumes; capBytes what MPS lets it use, never more than the claim
// asks; zero where it does not burst.
func (s *sizingLoop) burstSize(in *input, rq *request, w api.SizingWorkload, measured api.SizingRecommendation, asked int64) (guaranteed, capBytes int64) {
	p := in.pol
	if p.Sizing != api.SizingAuto || p.Latency != api.LatencyBestEffort || p.AllowSharedGPU || p.Isolation == api.IsolationExclusive ||
		rq.mode != api.SharingModeMPS || rq.count != 1 || rq.userCfg.MemoryLimit != nil || s.cfg.isExclusiveClass(rq.alt.class) ||
		!recreatable(in.claim, in.consumers) || !s.burst.Measured(w, s.now()) {
		return 0, 0
	}
	guaranteed, capBytes, ok := engine.BurstSize(measured, asked)
	if !ok {
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
// peaks together pass engine.NearCap of its memory (engine.Overfull). Caller holds neither
// the model's nor the sizer's lock.
func (s *sizingLoop) overfull(key model.GPUKey) (claimKey, share, why string) {
	var shares, keys []string
	tenants, memCap, published := s.model.GPUTenants(key)
	if !published {
		return "", "", ""
	}
	for _, t := range tenants {
		if t.BurstCap == 0 {
			return "", "", ""
		}
		shares, keys = append(shares, string(t.ShareID)), append(keys, t.Key)
	}
	if len(shares) < 2 {
		return "", "", ""
	}
	// Judged at the GPU's newest reported interval, every tenant at its use there (its
	// newest report where it wrote none since), grown over the interval before.
	uses, ok := s.burst.Uses(shares)
	if !ok {
		return "", "", ""
	}
	move, sum, ok := engine.Overfull(uses, memCap)
	if !ok {
		return "", "", ""
	}
	return keys[move], shares[move], fmt.Sprintf("the tenants of GPU %s/%s together used %s of its %s, and its use grew most (by %s); its controller recreates it where its workload's use fits",
		key.Pool, key.Device, fmtBytes(sum), fmtBytes(memCap), fmtBytes(max(0, uses[move].Cur-uses[move].Prev)))
}

// sizeBurst makes a request a bursting share where burstSize allows it, and says so with
// what it asked; it reports whether it did.
func (s *sizingLoop) sizeBurst(in *input, rq *request) bool {
	measured, ok := in.sized[rq.alt.name]
	if !ok || rq.whole || measured.ComputePercent >= engine.BusyComputePercent {
		return false
	}
	asked := int64(0)
	if q, has := rq.alt.capacity[api.CapacityMemory]; has {
		asked = q.Value()
	}
	w := api.SizingWorkload{Namespace: in.sizedFor.Namespace, Kind: in.sizedFor.Kind, Name: in.sizedFor.Name, Request: rq.alt.name}
	guaranteed, capBytes := s.burstSize(in, rq, w, measured, asked)
	if capBytes == 0 {
		return false
	}
	askedText := "a whole GPU"
	if asked > 0 {
		askedText = fmtBytes(asked)
	}
	rq.mem, rq.burstCap, rq.burstFor = guaranteed, capBytes, w
	rq.sized = fmt.Sprintf("request %q may burst (sizing Auto, best-effort, on a GPU only its isolation domain uses): guaranteed %s, the median of its report intervals' peaks, capped at %s, %d times the peak seen, from %d samples of %s %s/%s (asked %s)",
		rq.alt.name, fmtBytes(guaranteed), fmtBytes(capBytes), engine.CapFactor, measured.Samples, w.Kind, w.Namespace, w.Name, askedText)
	return true
}

// relieve asks Auto to move the bursting tenant that grew most off GPU key, where its
// tenants' newest reports together near its memory; and drops such a want once they do not.
func (s *sizingLoop) relieve(key model.GPUKey) {
	claimKey, share, why := s.overfull(key)
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	a := s.sizer.auto
	if claimKey == "" {
		for uid, want := range a.wants {
			if want.move == key && !want.drain {
				delete(a.wants, uid)
			}
		}
		return
	}
	ns, name, _ := strings.Cut(claimKey, "/")
	claim, err := s.claims.ResourceClaims(ns).Get(name)
	if err != nil || claim.Status.Allocation == nil {
		return
	}
	pods := s.claimPods(claim)
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
				move: key, why: why, since: s.now()}
		}
	}
}

// shouldBurst says whether a running share that does not burst would burst if placed again
// now: its pod was placed before its workload was measured, under MPS or holding a whole
// GPU it asked for, with no memory limit of its own, and its workload's use is neither busy
// (it keeps its whole GPU) nor idle (time-slicing). A pod placed since, that still does not
// burst, had a reason not to: it is never recreated for this. Caller holds the sizer's lock.
func (s *sizingLoop) shouldBurst(claim *resourceapi.ResourceClaim, r autoReport, rec api.SizingRecommendation, capBytes, gpuMem int64) bool {
	since := s.burst.MeasuredSince(r.w)
	at := claim.Status.Allocation.AllocationTimestamp
	if since.IsZero() || at == nil || !at.Time.Before(since) || !s.burst.Measured(r.w, s.now()) {
		return false
	}
	cfg := model.AllocationConfig(s.cfg.DriverName, claim.Status.Allocation.Devices.Config, r.result.Request)
	if cfg.MemoryLimit != nil || cfg.Mode == api.SharingModeTimeSlicing || s.cfg.isExclusiveClass(classOfRequest(claim, r.result.Request)) {
		return false
	}
	shares := 0
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Request == r.result.Request {
			shares++
		}
	}
	// A request for several devices would come back the same.
	return shares == 1 && engine.Rebursts(rec, capBytes, gpuMem, askedMemory(claim, r.result.Request))
}

// gib is a measured or derived byte count in GiB, as a person reads it.
func gib(b int64) float64 { return float64(b) / (1 << 30) }
