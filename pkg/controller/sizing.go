package controller

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/claimqueue"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// sizingLoop drives the sizing engine (pkg/sizing, pkg/sizing/engine) from the claims'
// usage reports: it recommends workload sizes, sizes bursting shares for the decision path,
// and under sizing Auto recreates pods larger, smaller, off a GPU that fills (relieve) or
// off one it empties (consolidate). It owns the recommender's and Auto's state (sizer,
// under its lock) and the burst history (engine.History, its own lock); what it reads and
// writes besides is handed to it by New.
//
// Lock order: the sizer's lock and the model's are never held together (considerResize
// reads the GPU's memory and overfull the GPU's tenants before the sizer's lock is
// taken); the burst history's lock is a leaf, taken under either.
type sizingLoop struct {
	sizer *sizer
	burst *engine.History[model.GPUKey]

	cfg *Config // the controller's, as New completed it
	listers
	model *model.Model
	// pending: a drain waits while the quota queue of a tenant's namespace is not empty.
	pending *claimqueue.Queue
	// gather is place's: a claim's decision input, outside the model's lock. place is the
	// decider, asked under it where a drained GPU's tenants would go.
	gather   func(ctx context.Context, claim *resourceapi.ResourceClaim) (*input, bool)
	place    placementPath
	client   kubernetes.Interface // evictions
	recorder record.EventRecorder
	metrics  *Metrics
	// fenced says why the allocator may not write now (nil: it may): no eviction then.
	fenced func() error
	// adoption is the before and after of sizing countAdoption counted last, for the metrics.
	adoption beforeAfter
}

// placementPath is what consolidation asks of the decision to place a drained GPU's
// tenants anew, as their recreated pods' claims would be: inside a model transaction, the
// placement core brought up to date, the smallest GPU a whole request may get and the
// core's filter for a request. The decider is it.
type placementPath interface {
	schedPolicy(l api.LatencyClass, w placement.Workload) placement.Policy
	model.NodeSource
	smallestGPU(tx *model.Tx, in *input) func(*request) int64
	gpuFilter(ctx context.Context, tx *model.Tx, in *input, d *decision, rq *request, rc *requestConstraints, rj *rejects) func(ni, gi int) bool
}

func (s *sizingLoop) now() time.Time { return s.cfg.Now() }

// sizer feeds the claims' measured use to the recommender and says when a workload's
// recommendation is new, moved enough to tell a person, or told long enough ago to be told
// again.
type sizer struct {
	mu        sync.Mutex
	rec       *sizing.Recommender
	announced map[api.SizingWorkload]announcement
	auto      *autoState
}

// announcement is the recommendation last told for a workload, and when.
type announcement struct {
	rec api.SizingRecommendation
	at  time.Time
}

// retellEvery is how often a recommendation that did not move is told again: the API server
// keeps an event an hour by default, and readers (kubectl fgpu recommendations and report)
// find a steady workload's recommendation only in an event it still keeps.
const retellEvery = 30 * time.Minute

func newSizer(opts sizing.Options, shrinkAfter time.Duration) *sizer {
	return &sizer{rec: sizing.NewRecommender(opts), announced: map[api.SizingWorkload]announcement{}, auto: newAutoState(opts.Headroom, shrinkAfter)}
}

// observeUsage takes the usage summaries the kubelet plugin wrote into the claim's
// status.devices (which a tenant cannot write) for the shares of its allocation, for the
// workload of the claim's pods, and records an event on the claim when the workload's
// recommendation appears or moves.
func (s *sizingLoop) observeUsage(claim *resourceapi.ResourceClaim) {
	if s.sizer == nil || claim.Status.Allocation == nil || len(claim.Status.Devices) == 0 {
		return
	}
	pods := s.claimPods(claim)
	if len(pods) == 0 {
		return
	}
	top := topOwner(pods[0])
	pol := s.policyOf(claim.Namespace, pods[0])
	mode := pol.Sizing
	burstable := pol.Latency == api.LatencyBestEffort && !pol.AllowSharedGPU && pol.Isolation != api.IsolationExclusive
	var changed []api.SizingRecord
	var auto []autoReport
	s.sizer.mu.Lock()
	for _, st := range claim.Status.Devices {
		if st.Driver != s.cfg.DriverName || st.Data == nil || st.ShareID == nil {
			continue
		}
		req := allocatedRequest(claim.Status.Allocation, st)
		if req == "" {
			continue // not a share of the current allocation
		}
		var data api.DeviceStatusData
		if json.Unmarshal(st.Data.Raw, &data) != nil || data.Usage == nil {
			continue
		}
		w := api.SizingWorkload{Namespace: claim.Namespace, Kind: top.Kind, Name: top.Name, Request: req}
		if !s.sizer.rec.Add(w, *st.ShareID, *data.Usage) {
			continue
		}
		if mode == api.SizingAuto {
			s.burst.Record(w, *st.ShareID, *data.Usage, s.now())
		}
		if mode == api.SizingAuto && len(pods) == 1 {
			auto = append(auto, autoReport{w: w, share: *st.ShareID, result: allocatedResult(claim.Status.Allocation, st), u: *data.Usage, burstable: burstable})
		}
		if r, ok := s.announce(w, mode); ok {
			changed = append(changed, r)
		}
	}
	s.sizer.mu.Unlock()
	for _, r := range auto {
		s.considerResize(claim, pods[0], r)
		s.relieve(model.GPUKey{Pool: r.result.Pool, Device: r.result.Device})
	}
	s.tell(claim, changed, mode, modeEffect[mode])
}

// tell records an event on obj for each recommendation that appeared or moved, with what
// the sizing mode does with it (effect).
func (s *sizingLoop) tell(obj runtime.Object, changed []api.SizingRecord, mode api.SizingMode, effect string) {
	for _, r := range changed {
		raw, _ := json.Marshal(r)
		s.recorder.AnnotatedEventf(obj, map[string]string{api.AnnotationSizingRecord: string(raw)}, corev1.EventTypeNormal, ReasonSizingRecommendation,
			"%s %s/%s request %s: recommended memory %s, compute %d%% (peak seen %s, from %d samples); sizing %s: %s",
			r.Workload.Kind, r.Workload.Namespace, r.Workload.Name, r.Workload.Request, quantity(r.Recommendation.MemoryBytes),
			r.Recommendation.ComputePercent, quantity(r.Recommendation.PeakBytes), r.Recommendation.Samples, mode, effect)
	}
}

// announce is the recommendation to tell for w, if it is new, moved, or was told long
// enough ago. Caller holds the sizer's lock.
func (s *sizingLoop) announce(w api.SizingWorkload, mode api.SizingMode) (api.SizingRecord, bool) {
	rec, ok := s.sizer.rec.Recommend(w)
	if !ok || mode == api.SizingOff {
		return api.SizingRecord{}, false // an Off workload's history is kept, so that Recommend has it at once
	}
	if prev, had := s.sizer.announced[w]; had && !moved(prev.rec, rec) && s.now().Sub(prev.at) < retellEvery {
		return api.SizingRecord{}, false
	}
	s.sizer.announced[w] = announcement{rec: rec, at: s.now()}
	return api.SizingRecord{Workload: w, Recommendation: rec}, true
}

// modeEffect says, in the recommendation event, what the sizing mode does with it.
var modeEffect = map[api.SizingMode]string{
	api.SizingRecommend: "nothing is changed",
	api.SizingInitial:   "new pods of the workload get it, running ones keep their size",
	api.SizingAuto:      "new pods of the workload get it; running ones near their cap or far below it are evicted, one at a time, to come back at it",
}

// observedEffect says, in the recommendation event on a pod fgpu did not place (observe
// mode), what the sizing mode does with it: nothing to that pod, which fgpu cannot resize.
var observedEffect = map[api.SizingMode]string{
	api.SizingRecommend: "nothing is changed",
	api.SizingInitial:   "nothing is changed for this pod, which fgpu does not serve; once fgpu serves the workload, its new pods get it",
	api.SizingAuto:      "nothing is changed for this pod, which fgpu does not serve; once fgpu serves the workload, its new pods get it and sizing auto resizes them",
}

// forgetUsage drops what the recommender keeps of a deleted claim's shares.
func (s *sizingLoop) forgetUsage(claim *resourceapi.ResourceClaim) {
	if s.sizer == nil {
		return
	}
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.ShareID != nil {
			s.sizer.rec.Forget(*st.ShareID)
			s.burst.ForgetShare(*st.ShareID)
			// A tenant gone from a GPU that filled may have made room: its move waits for
			// the GPU's next report.
			for uid, want := range s.sizer.auto.wants {
				if want.move == (model.GPUKey{Pool: st.Pool, Device: st.Device}) && !want.drain {
					delete(s.sizer.auto.wants, uid)
				}
			}
			s.sizer.auto.resizer.ForgetShare(*st.ShareID)
			delete(s.sizer.auto.toldAtRequest, *st.ShareID)
		}
	}
}

// usageSweepInterval is how often the recommender forgets silent workloads (VPA collects
// its histories' garbage hourly too).
const usageSweepInterval = time.Hour

// sweepUsage forgets the workloads no claim reported for sizing.ForgetAfterHalfLives
// half-lives, and what was told of them, so that the allocator's memory follows the
// workloads that run, not every one that ever did.
func (s *sizingLoop) sweepUsage(context.Context) {
	if s.sizer == nil {
		return
	}
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	s.sizer.rec.Prune(s.now())
	s.burst.KeepWorkloads(s.sizer.rec.Has)
	for w := range s.sizer.announced {
		if !s.sizer.rec.Has(w) {
			delete(s.sizer.announced, w)
		}
	}
	for w := range s.sizer.auto.last {
		if !s.sizer.rec.Has(w) && s.sizer.auto.resizer.Floor(w) > 0 {
			delete(s.sizer.auto.last, w) // as its floor is, below
		}
	}
	s.sizer.auto.resizer.KeepWorkloads(s.sizer.rec.Has)
}

// Recommendation is the recommender's current size for a workload.
func (s *sizingLoop) Recommendation(w api.SizingWorkload) (api.SizingRecommendation, bool) {
	if s.sizer == nil {
		return api.SizingRecommendation{}, false
	}
	s.sizer.mu.Lock()
	defer s.sizer.mu.Unlock()
	rec, ok := s.sizer.rec.Recommend(w)
	if ok {
		rec.MemoryBytes = max(rec.MemoryBytes, s.sizer.auto.resizer.Floor(w))
	}
	return rec, ok
}

// moved: worth telling again (the same thresholds as the plugin's reports).
func moved(prev, cur api.SizingRecommendation) bool {
	d := cur.MemoryBytes - prev.MemoryBytes
	return max(d, -d) > max(sizing.MemoryStep, prev.MemoryBytes/10) || max(cur.ComputePercent-prev.ComputePercent, prev.ComputePercent-cur.ComputePercent) > 10
}

// allocatedRequest is the request of the allocation result a device status entry is for, or
// "" when the allocation has no such share.
func allocatedRequest(a *resourceapi.AllocationResult, st resourceapi.AllocatedDeviceStatus) string {
	return allocatedResult(a, st).Request
}

// allocatedResult is the allocation result a device status entry is for (zero when none).
func allocatedResult(a *resourceapi.AllocationResult, st resourceapi.AllocatedDeviceStatus) resourceapi.DeviceRequestAllocationResult {
	for _, r := range a.Devices.Results {
		if r.Driver == st.Driver && r.Pool == st.Pool && r.Device == st.Device && r.ShareID != nil && st.ShareID != nil && string(*r.ShareID) == *st.ShareID {
			return r
		}
	}
	return resourceapi.DeviceRequestAllocationResult{}
}

// topOwner is the workload a pod belongs to (api.WorkloadOf, which readers outside the
// allocator name workloads by too), as the kind and name of its top owner.
func topOwner(pod *corev1.Pod) metav1.OwnerReference {
	w := api.WorkloadOf(pod, "")
	return metav1.OwnerReference{Kind: w.Kind, Name: w.Name}
}

func quantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
