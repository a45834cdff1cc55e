// Package adoption is the before and after of sizing with fgpu: for each workload that holds
// GPUs through fgpu's claims or outside fgpu (NVIDIA's device plugin: as its pods ask for
// them, measured by fgpu's observe mode), what it holds now, what it was measured using and
// the size fgpu recommends; for them all, the GPUs they hold now, each GPU once, against the
// GPUs they would need at those sizes, packed by the allocator's placement core.
//
// `kubectl fgpu report` (pkg/clusterview) computes it from what it lists with its caller's
// credentials, the allocator (pkg/controller) from its informers' caches and its own
// recommendations for its metrics: both with this package, so that the dashboard and the
// report count alike.
package adoption

import (
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Window is how recent a usage report or a recommendation must be to count, where the caller
// names none: `kubectl fgpu report`'s default --since, and the allocator's metrics.
const Window = 24 * time.Hour

// GPU is one published GPU as the packing sees it.
type GPU struct {
	Node, Device, Product string
	Memory                int64 // allocatable
}

// Share is one placed share of a claim request (or one pod fgpu did not place), as the
// before and after counts and packs it.
type Share struct {
	Workload api.SizingWorkload
	GPUs     []*GPU // one share asks for all of them on one node
	Held     int64
	Whole    bool // it holds all of its GPUs' memory, alone
	Use      *api.ShareUsage
	// Size is what it is packed at on each GPU where its workload has no recommendation:
	// what it holds of each, or, time-sliced, its slice of the GPU.
	Size int64
	// Observed: a pod fgpu did not place (observe mode), which holds all of its GPUs' memory,
	// alone or, TimeSliced, beside other pods; Estimated: which GPUs it holds is not known.
	// Fixed: on a node fgpu does not publish, so not packed. NoSamples: on a node the kubelet
	// plugin observes, it ran nothing seen in the window.
	Observed, TimeSliced, Estimated, Fixed, NoSamples bool
}

// PodLookup finds a pod by namespace and name; nil where there is none.
type PodLookup func(namespace, name string) *corev1.Pod

// PlacedShares lists the shares of the driver's claims on gpus (by pool/device), each with
// its workload and its newest usage report where it is not older than from.
func PlacedShares(claims []*resourceapi.ResourceClaim, driver string, pod PodLookup, gpus map[string]*GPU, from time.Time) []Share {
	var out []Share
	for _, cl := range claims {
		if cl.Status.Allocation == nil {
			continue
		}
		// One share per request: a request of several GPUs has them all on one node.
		byRequest := map[string]*Share{}
		var requests []string
		for _, res := range cl.Status.Allocation.Devices.Results {
			g := gpus[res.Pool+"/"+res.Device]
			if res.Driver != driver || g == nil {
				continue
			}
			s := byRequest[res.Request]
			if s == nil {
				s = &Share{Workload: workloadOf(cl, pod, res.Request), Whole: true}
				byRequest[res.Request] = s
				requests = append(requests, res.Request)
			}
			s.GPUs = append(s.GPUs, g)
			held := HeldMemory(res, g.Memory)
			s.Held += held
			s.Whole = s.Whole && held >= g.Memory
			if data, ok := ShareStatus(cl, res); ok && data.Usage != nil && !data.Usage.To.Before(from) {
				s.Use = merged(s.Use, data.Usage)
			}
		}
		for _, req := range requests {
			sh := byRequest[req]
			sh.Size = sh.Held / int64(len(sh.GPUs))
			out = append(out, *sh)
		}
	}
	return out
}

// workloadOf names the workload of a claim's request by the first of its pods that still
// exists, as the allocator's sizing does; a claim no pod uses is its own.
func workloadOf(cl *resourceapi.ResourceClaim, pod PodLookup, request string) api.SizingWorkload {
	for _, ref := range cl.Status.ReservedFor {
		if ref.Resource != "pods" {
			continue
		}
		if p := pod(cl.Namespace, ref.Name); p != nil && p.UID == ref.UID {
			return api.WorkloadOf(p, request)
		}
	}
	return api.SizingWorkload{Namespace: cl.Namespace, Kind: "ResourceClaim", Name: cl.Name, Request: request}
}

// HeldMemory is the memory an allocation result holds on a GPU of gpuMemory: what it
// consumes, or, a whole GPU (no consumed memory), all of it, as the allocator counts it.
func HeldMemory(r resourceapi.DeviceRequestAllocationResult, gpuMemory int64) int64 {
	if q, ok := r.ConsumedCapacity[api.CapacityMemory]; ok {
		return q.Value()
	}
	return gpuMemory
}

// ShareStatus is what the kubelet plugin wrote into the claim's status for the share of an
// allocation result (which only the plugin may write), and whether it wrote anything.
func ShareStatus(cl *resourceapi.ResourceClaim, res resourceapi.DeviceRequestAllocationResult) (api.DeviceStatusData, bool) {
	var data api.DeviceStatusData
	found := false
	for _, st := range cl.Status.Devices {
		if st.Driver != res.Driver || st.Pool != res.Pool || st.Device != res.Device || st.Data == nil {
			continue
		}
		if res.ShareID != nil && (st.ShareID == nil || *st.ShareID != string(*res.ShareID)) {
			continue // the status of an earlier allocation
		}
		var d api.DeviceStatusData
		if json.Unmarshal(st.Data.Raw, &d) != nil {
			continue
		}
		data, found = d, true
	}
	return data, found
}

// merged is the usage of a share of several GPUs: their reports side by side, summed.
func merged(a, b *api.ShareUsage) *api.ShareUsage {
	if a == nil {
		u := *b
		return &u
	}
	u := *a
	if b.From.Before(u.From) {
		u.From = b.From
	}
	if b.To.After(u.To) {
		u.To = b.To
	}
	u.MemoryMaxBytes += b.MemoryMaxBytes
	u.MemoryP95Bytes += b.MemoryP95Bytes
	u.MemoryMeanBytes += b.MemoryMeanBytes
	if b.SMSamples > 0 {
		u.SMMeanPercent = (u.SMMeanPercent*u.SMSamples + b.SMMeanPercent*b.SMSamples) / (u.SMSamples + b.SMSamples)
		u.SMSamples += b.SMSamples
		u.SMP95Percent = max(u.SMP95Percent, b.SMP95Percent)
		u.SMMaxPercent = max(u.SMMaxPercent, b.SMMaxPercent)
	}
	u.Samples += b.Samples
	return &u
}
