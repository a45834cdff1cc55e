package v1alpha1

import (
	"fmt"
	"time"
)

// DeviceStatusData is what the kubelet plugin writes into ResourceClaim
// status.devices[].data for each prepared fgpu share (`kubectl get resourceclaim -o yaml`
// shows it). The allocator (sizing, idle scale-down), kubectl-fgpu and the e2e suites read
// it back, so it has this one definition.
type DeviceStatusData struct {
	GPUUUID string `json:"gpuUUID"`
	// Memory is what the share was allocated (guaranteed); MemoryLimit is its cap: below or
	// at Memory, or above it for a burst share (the allocator's placement.memoryLimit).
	Memory         string `json:"memory"`
	MemoryLimit    string `json:"memoryLimit"`
	ComputePercent int64  `json:"computePercent"`
	ThreadPercent  int64  `json:"threadPercent"`
	Mode           string `json:"mode"`
	// IsolationDomain is "<namespace>/<sub-domain>": the MPS server the share uses.
	IsolationDomain string `json:"isolationDomain"`
	// MemoryEnforced says whether nothing in the claim's containers can pin more than
	// MemoryLimit: false under time-slicing, and under MPS where other isolation domains
	// may share the GPU (a process that bypasses MPS is not capped).
	MemoryEnforced bool `json:"memoryEnforced"`
	// MemoryEnforcement says why, in one line.
	MemoryEnforcement string `json:"memoryEnforcement,omitempty"`
	// MemoryCap is what caps the share's memory: cgroup (the pod as a whole, and each MPS
	// client process), mps-per-process, none (time-slicing) or whole-gpu.
	MemoryCap string `json:"memoryCap,omitempty"`
	// Usage is what the share's processes used, as the plugin last reported it; absent
	// until it has measured the share for a report interval.
	Usage *ShareUsage `json:"usage,omitempty"`
}

// ShareUsage is what one share of a claim used over a span, as the kubelet plugin measured it
// every few seconds (pkg/sizing summarises the samples): it is published as `usage` in the
// share's DeviceStatusData. Memory is the sum over the claim's processes on the GPU; SM
// activity too (capped at 100), over the samples the driver gave one (SMSamples of Samples).
type ShareUsage struct {
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	Samples int       `json:"samples"`

	MemoryMaxBytes  int64 `json:"memoryMaxBytes"`
	MemoryP95Bytes  int64 `json:"memoryP95Bytes"`
	MemoryMeanBytes int64 `json:"memoryMeanBytes"`

	SMSamples     int `json:"smSamples"`
	SMMaxPercent  int `json:"smMaxPercent"`
	SMP95Percent  int `json:"smP95Percent"`
	SMMeanPercent int `json:"smMeanPercent"`
}

// SizingRecord is what AnnotationSizingRecord holds, as JSON, on each sizing recommendation
// event the allocator records; `fgpu recommendations` reads it back.
type SizingRecord struct {
	Workload       SizingWorkload       `json:"workload"`
	Recommendation SizingRecommendation `json:"recommendation"`
}

// SizingWorkload is what a recommendation is for: the top owner of a claim's pods (a
// Deployment through its ReplicaSet, a StatefulSet, a CronJob through its Job, …, or the pod
// itself) in its namespace, and the claim's request. Its namespace is the claim's: a
// tenant's pods only ever size that tenant's workloads.
type SizingWorkload struct {
	Namespace string `json:"namespace"`
	Kind      string `json:"kind"`
	Name      string `json:"name"`
	Request   string `json:"request"`
}

func (w SizingWorkload) String() string {
	return fmt.Sprintf("%s/%s/%s request %s", w.Namespace, w.Kind, w.Name, w.Request)
}

// SizingRecommendation is the size the allocator's recommender (pkg/sizing) gives a
// workload's claims.
type SizingRecommendation struct {
	MemoryBytes    int64 `json:"memoryBytes"`
	ComputePercent int   `json:"computePercent"`
	// Samples is how many measured samples it rests on; PeakBytes the largest memory seen.
	Samples   int   `json:"samples"`
	PeakBytes int64 `json:"peakBytes"`
	// TypicalBytes is the median of the report intervals' peaks, without headroom: what a
	// share that may burst is guaranteed (sizing Auto's burst model).
	TypicalBytes int64 `json:"typicalBytes,omitempty"`
}

// ObservedUsage is what the kubelet plugin measured of the GPU pods on its node that fgpu
// did not place (NVIDIA's device plugin's, a host job's): observe mode, the "before" of an
// adoption. It is kept as JSON under ObservedUsageKey in the ConfigMap
// ObservedUsagePrefix+<node> of the chart's namespace, labelled LabelObservedUsage=<node>,
// which only the plugins and administrators may write; the allocator reads it into the
// same sizing histories as its own claims' use.
type ObservedUsage struct {
	Node string        `json:"node"`
	Pods []ObservedPod `json:"pods"`
}

// ObservedPod is one pod's use of the GPUs fgpu did not give it, per GPU.
type ObservedPod struct {
	Namespace string        `json:"namespace"`
	Name      string        `json:"name"`
	UID       string        `json:"uid"`
	GPUs      []ObservedGPU `json:"gpus"`
}

// ObservedGPU is a pod's use of one GPU over the report interval.
type ObservedGPU struct {
	UUID   string     `json:"uuid"`
	Device string     `json:"device"` // gpu-<index>, as the ResourceSlice names it
	Usage  ShareUsage `json:"usage"`
}
