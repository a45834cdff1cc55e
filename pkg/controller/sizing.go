package controller

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// sizer feeds the claims' measured use to the recommender and says when a workload's
// recommendation is new or moved enough to tell a person.
type sizer struct {
	mu        sync.Mutex
	rec       *sizing.Recommender
	announced map[api.SizingWorkload]api.SizingRecommendation
	auto      *autoState
}

func newSizer(opts sizing.Options, shrinkAfter time.Duration) *sizer {
	return &sizer{rec: sizing.NewRecommender(opts), announced: map[api.SizingWorkload]api.SizingRecommendation{}, auto: newAutoState(opts.Headroom, shrinkAfter)}
}

// observeUsage takes the usage summaries the kubelet plugin wrote into the claim's
// status.devices (which a tenant cannot write) for the shares of its allocation, for the
// workload of the claim's pods, and records an event on the claim when the workload's
// recommendation appears or moves.
func (c *Controller) observeUsage(claim *resourceapi.ResourceClaim) {
	if c.sizer == nil || claim.Status.Allocation == nil || len(claim.Status.Devices) == 0 {
		return
	}
	pods := c.claimPods(claim)
	if len(pods) == 0 {
		return
	}
	top := topOwner(pods[0])
	pol := c.policyOf(claim, pods[0])
	mode := pol.Sizing
	burstable := pol.Latency == api.LatencyBestEffort && !pol.AllowSharedGPU && pol.Isolation != api.IsolationExclusive
	var changed []api.SizingRecord
	var auto []autoReport
	c.sizer.mu.Lock()
	for _, st := range claim.Status.Devices {
		if st.Driver != c.cfg.DriverName || st.Data == nil || st.ShareID == nil {
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
		if !c.sizer.rec.Add(w, *st.ShareID, *data.Usage) {
			continue
		}
		if mode == api.SizingAuto {
			c.burst.Record(w, *st.ShareID, *data.Usage, c.now())
		}
		if mode == api.SizingAuto && len(pods) == 1 {
			auto = append(auto, autoReport{w: w, share: *st.ShareID, result: allocatedResult(claim.Status.Allocation, st), u: *data.Usage, burstable: burstable})
		}
		rec, ok := c.sizer.rec.Recommend(w)
		if !ok || mode == api.SizingOff {
			continue // an Off workload's history is kept, so that Recommend has it at once
		}
		if prev, had := c.sizer.announced[w]; !had || moved(prev, rec) {
			c.sizer.announced[w] = rec
			changed = append(changed, api.SizingRecord{Workload: w, Recommendation: rec})
		}
	}
	c.sizer.mu.Unlock()
	for _, r := range auto {
		c.considerResize(claim, pods[0], r)
		c.relieve(gpuKey{r.result.Pool, r.result.Device})
	}
	for _, r := range changed {
		raw, _ := json.Marshal(r)
		c.recorder.AnnotatedEventf(claim, map[string]string{api.AnnotationSizingRecord: string(raw)}, corev1.EventTypeNormal, ReasonSizingRecommendation,
			"%s %s/%s request %s: recommended memory %s, compute %d%% (peak seen %s, from %d samples); sizing %s: %s",
			r.Workload.Kind, r.Workload.Namespace, r.Workload.Name, r.Workload.Request, quantity(r.Recommendation.MemoryBytes),
			r.Recommendation.ComputePercent, quantity(r.Recommendation.PeakBytes), r.Recommendation.Samples, mode, modeEffect[mode])
	}
}

// modeEffect says, in the recommendation event, what the sizing mode does with it.
var modeEffect = map[api.SizingMode]string{
	api.SizingRecommend: "nothing is changed",
	api.SizingInitial:   "new pods of the workload get it, running ones keep their size",
	api.SizingAuto:      "new pods of the workload get it; running ones near their cap or far below it are evicted, one at a time, to come back at it",
}

// forgetUsage drops what the recommender keeps of a deleted claim's shares.
func (c *Controller) forgetUsage(claim *resourceapi.ResourceClaim) {
	if c.sizer == nil {
		return
	}
	c.sizer.mu.Lock()
	defer c.sizer.mu.Unlock()
	for _, st := range claim.Status.Devices {
		if st.ShareID != nil {
			c.sizer.rec.Forget(*st.ShareID)
			c.burst.ForgetShare(*st.ShareID)
			// A tenant gone from a GPU that filled may have made room: its move waits for
			// the GPU's next report.
			for uid, want := range c.sizer.auto.wants {
				if want.move == (gpuKey{st.Pool, st.Device}) && !want.drain {
					delete(c.sizer.auto.wants, uid)
				}
			}
			c.sizer.auto.resizer.ForgetShare(*st.ShareID)
			delete(c.sizer.auto.toldAtRequest, *st.ShareID)
		}
	}
}

// usageSweepInterval is how often the recommender forgets silent workloads (VPA collects
// its histories' garbage hourly too).
const usageSweepInterval = time.Hour

// sweepUsage forgets the workloads no claim reported for sizing.ForgetAfterHalfLives
// half-lives, and what was told of them, so that the allocator's memory follows the
// workloads that run, not every one that ever did.
func (c *Controller) sweepUsage(context.Context) {
	if c.sizer == nil {
		return
	}
	c.sizer.mu.Lock()
	defer c.sizer.mu.Unlock()
	c.sizer.rec.Prune(c.now())
	c.burst.KeepWorkloads(c.sizer.rec.Has)
	for w := range c.sizer.announced {
		if !c.sizer.rec.Has(w) {
			delete(c.sizer.announced, w)
		}
	}
	for w := range c.sizer.auto.last {
		if !c.sizer.rec.Has(w) && c.sizer.auto.resizer.Floor(w) > 0 {
			delete(c.sizer.auto.last, w) // as its floor is, below
		}
	}
	c.sizer.auto.resizer.KeepWorkloads(c.sizer.rec.Has)
}

// Recommendation is the recommender's current size for a workload.
func (c *Controller) Recommendation(w api.SizingWorkload) (api.SizingRecommendation, bool) {
	if c.sizer == nil {
		return api.SizingRecommendation{}, false
	}
	c.sizer.mu.Lock()
	defer c.sizer.mu.Unlock()
	rec, ok := c.sizer.rec.Recommend(w)
	if ok {
		rec.MemoryBytes = max(rec.MemoryBytes, c.sizer.auto.resizer.Floor(w))
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

// cronJobRun matches the name the CronJob controller gives a Job: the CronJob's name and its
// scheduled time in minutes.
var cronJobRun = regexp.MustCompile(`^(.+)-[0-9]{8,}$`)

// topOwner is the workload a pod belongs to, from its controller reference and the names
// Kubernetes' controllers give what they create, without reading the owners: a ReplicaSet
// named <deployment>-<pod-template-hash> is its Deployment's, a Job named
// <cronjob>-<minutes> its CronJob's. All of it is the tenant's to write, which only ever
// moves its pods among the workloads of its own namespace.
func topOwner(pod *corev1.Pod) metav1.OwnerReference {
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return metav1.OwnerReference{Kind: "Pod", Name: pod.Name}
	}
	switch ref.Kind {
	case "ReplicaSet":
		if h := pod.Labels["pod-template-hash"]; h != "" && strings.HasSuffix(ref.Name, "-"+h) {
			return metav1.OwnerReference{Kind: "Deployment", Name: strings.TrimSuffix(ref.Name, "-"+h)}
		}
	case "Job":
		if m := cronJobRun.FindStringSubmatch(ref.Name); m != nil {
			return metav1.OwnerReference{Kind: "CronJob", Name: m[1]}
		}
	}
	return metav1.OwnerReference{Kind: ref.Kind, Name: ref.Name}
}

func quantity(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
