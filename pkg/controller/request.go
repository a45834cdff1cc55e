package controller

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// alt is one way to satisfy a request: the request itself or one of its firstAvailable
// subrequests.
type alt struct {
	name        string // result name: "req" or "req/sub"
	class       string
	selectors   []resourceapi.DeviceSelector
	mode        resourceapi.DeviceAllocationMode
	count       int64
	tolerations []resourceapi.DeviceToleration
	capacity    map[resourceapi.QualifiedName]resource.Quantity
	adminAccess bool
}

func alternatives(r resourceapi.DeviceRequest) []alt {
	if e := r.Exactly; e != nil {
		a := alt{name: r.Name, class: e.DeviceClassName, selectors: e.Selectors, mode: e.AllocationMode, count: e.Count,
			tolerations: e.Tolerations, adminAccess: e.AdminAccess != nil && *e.AdminAccess}
		if e.Capacity != nil {
			a.capacity = e.Capacity.Requests
		}
		return []alt{a}
	}
	out := make([]alt, 0, len(r.FirstAvailable))
	for _, s := range r.FirstAvailable {
		a := alt{name: r.Name + "/" + s.Name, class: s.DeviceClassName, selectors: s.Selectors, mode: s.AllocationMode, count: s.Count, tolerations: s.Tolerations}
		if s.Capacity != nil {
			a.capacity = s.Capacity.Requests
		}
		out = append(out, a)
	}
	return out
}

// request is an alternative made concrete under the claim's policy and configs: what each
// of its devices asks of a GPU before one is chosen.
type request struct {
	alt     alt
	class   *resourceapi.DeviceClass
	count   int64
	whole   bool   // whole GPUs: an exclusive class, an exclusive policy, or no memory asked
	mem     int64  // memory per device, rounded up to api.MemoryStep (0 when whole)
	comp    *int64 // compute asked, if any
	mode    api.SharingMode
	domain  model.Domain
	userCfg *api.GpuConfig
	// sized says what the request asked and got where its workload's recommendation sized it.
	sized string
	// burstCap is, for a bursting share (burst.go), the memory MPS lets it use above mem,
	// its guaranteed part; burstFor its workload.
	burstCap int64
	burstFor api.SizingWorkload
}

// capOn is the burst cap of a device of the request on GPU g, where it gets mem: never
// more than the GPU; 0 where that leaves nothing above mem to burst into.
func (rq *request) capOn(g *model.GPU, mem int64) int64 {
	if c := min(rq.burstCap, g.MemCap()); c > mem {
		return c
	}
	return 0
}

// resolution resolves the alternatives of a claim's requests, each once per decision and
// only when asked: the quota check and the placement of each request read the same.
type resolution struct {
	cfg         *Config
	in          *input
	smallestGPU func(*request) int64
	done        map[string]resolvedAlt
}

type resolvedAlt struct {
	rq *request
	w  *waitReason
}

func newResolution(cfg *Config, in *input, smallestGPU func(*request) int64) *resolution {
	return &resolution{cfg: cfg, in: in, smallestGPU: smallestGPU, done: map[string]resolvedAlt{}}
}

// request is alternative a resolved: a copy, which placing it may change (sizeBurst sizes
// a bursting share), or why it cannot be allocated. Called inside the model transaction
// smallestGPU reads.
func (res *resolution) request(a alt) (*request, *waitReason) {
	r, ok := res.done[a.name]
	if !ok {
		r.rq, r.w = resolveRequest(res.cfg, res.in, a, res.smallestGPU)
		res.done[a.name] = r
	}
	if r.w != nil {
		return nil, r.w
	}
	rq := *r.rq
	return &rq, nil
}

// resolveRequest sizes an alternative, and chooses its mode and isolation domain, from the
// claim, its class and its policy; or says why the alternative cannot be allocated. It
// looks at nothing else: no GPU, no node, no other claim.
// maxRequestMemory bounds the memory a request may ask: far above any GPU, and small enough
// that the arithmetic on it (times a count, a share of 1,000, a percent) cannot overflow.
const maxRequestMemory = int64(1) << 50

func resolveRequest(cfg *Config, in *input, a alt, smallestGPU func(*request) int64) (*request, *waitReason) {
	unsupported := func(format string, args ...any) (*request, *waitReason) {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf(format, args...)}
	}
	if !cfg.isFgpuClass(a.class) {
		return unsupported("request %q asks for DeviceClass %q, which the fgpu allocator does not allocate; a claim that mixes fgpu and other devices cannot be allocated in allocator mode", a.name, a.class)
	}
	class := in.classes[a.class]
	if class == nil {
		return nil, &waitReason{reason: ReasonWaiting, message: fmt.Sprintf("DeviceClass %q does not exist", a.class)}
	}
	if a.adminAccess {
		return unsupported("request %q: adminAccess is not supported by the fgpu allocator", a.name)
	}
	if a.mode == resourceapi.DeviceAllocationModeAll {
		return unsupported("request %q: allocationMode All is not supported by the fgpu allocator; ask for a count", a.name)
	}
	userCfg, err := api.MergeConfigs(cfg.DriverName, api.RequestConfigs(class.Spec.Config, in.claim.Spec.Devices.Config, a.name), a.name)
	if err != nil {
		return unsupported("request %q: %v", a.name, err)
	}
	if userCfg.Placement != nil {
		// It would be copied into the allocation, where the allocator reads its own rules.
		return unsupported("request %q: placement is written by the fgpu allocator only; remove it from the claim's and its DeviceClass's fgpu config", a.name)
	}
	rq := &request{alt: a, class: class, count: max(a.count, 1), userCfg: userCfg}
	memQ, hasMem := a.capacity[api.CapacityMemory]
	rq.whole = cfg.isExclusiveClass(a.class) || in.pol.Isolation == api.IsolationExclusive || !hasMem
	if hasMem {
		if memQ.Sign() <= 0 {
			return unsupported("request %q: memory %s must be positive", a.name, memQ.String())
		}
		if memQ.Cmp(*resource.NewQuantity(maxRequestMemory, resource.BinarySI)) > 0 {
			// The API server bounds no capacity request; one near 2^63 wrapped negative when
			// rounded to the step and took the namespace's compute quota with it.
			return unsupported("request %q: memory %s is more than any GPU has (at most %s)", a.name, memQ.String(), fmtBytes(maxRequestMemory))
		}
		rq.mem = roundUp(memQ.Value(), api.MemoryStep)
	}
	if q, ok := a.capacity[api.CapacityCompute]; ok {
		v := q.Value()
		if v < 0 || v > 100 {
			return unsupported("request %q: compute %s must be 0-100 (percent of a GPU)", a.name, q.String())
		}
		rq.comp = &v
	}
	for k := range a.capacity {
		if k != api.CapacityMemory && k != api.CapacityCompute {
			return unsupported("request %q: unknown capacity %q (fgpu devices have memory and compute)", a.name, k)
		}
	}
	measured, isMeasured := in.sized[a.name]
	var modeNote string
	rq.mode, modeNote = sharingMode(in.pol, userCfg, measured, isMeasured)
	switch {
	case !isMeasured || rq.count != 1 || cfg.isExclusiveClass(a.class) || in.pol.Isolation == api.IsolationExclusive:
	case modeNote == busyNote && rq.whole:
		// Sizing it to a share would only queue its kernels behind its co-tenants'.
		rq.sized = fmt.Sprintf("request %q keeps the whole GPU it asked for: %s %s/%s %s", a.name, in.sizedFor.Kind, in.sizedFor.Namespace, in.sizedFor.Name, busyNote)
	default:
		rq.applySizing(measured, in.sizedFor, smallestGPU)
		if modeNote != "" && !rq.whole {
			rq.sized = strings.TrimPrefix(strings.Join([]string{rq.sized, fmt.Sprintf("request %q: mode %s from measurement: %s", a.name, rq.mode, modeNote)}, "; "), "; ")
		}
	}
	rq.domain = model.Domain{Namespace: in.claim.Namespace, Sub: subDomain(userCfg)}
	if rq.count > 1 && !rq.whole && rq.mode != api.SharingModeTimeSlicing {
		return unsupported("request %q asks for %d shares of GPUs through MPS, but a container reaches one MPS server: ask for whole GPUs, one share, or mode timeSlicing", a.name, rq.count)
	}
	// The plugin refuses to prepare limits above the allocation (pkg/plugin planDevice):
	// allocating them would leave the pod in ContainerCreating, holding the capacity. What a
	// share gets is known here; what a whole GPU or a derived compute gets, per GPU (limitsFit).
	if l := userCfg.MemoryLimit; l != nil && !rq.whole && l.Value() > rq.mem {
		asked := memQ.String()
		if memQ.Value() != rq.mem {
			asked += ", " + fmtBytes(rq.mem) + " once rounded up to the " + fmtBytes(api.MemoryStep) + " step"
		}
		return unsupported("request %q: memoryLimit %s is above the memory it asks (%s); lower the limit or ask for more memory", a.name, l.String(), asked)
	}
	if p := userCfg.ComputePercent; p != nil && !rq.whole && rq.comp != nil && *rq.comp > 0 && int64(*p) > *rq.comp {
		return unsupported("request %q: computePercent %d is above the compute it asks (%d%%); lower the limit or ask for more compute", a.name, *p, *rq.comp)
	}
	return rq, nil
}

// applySizing lowers the request to its workload's recommendation (sizing mode Initial):
// never above what it asks, nor below the limits its config sets. A request for a whole GPU
// (no memory asked) becomes a share of the recommended memory and compute, unless the
// recommendation fills the smallest GPU the request may get (smallestGPU): a share that large
// fits no GPU, where the whole GPU it asked does. Otherwise compute is lowered only where the
// request asks for some.
func (rq *request) applySizing(r api.SizingRecommendation, w api.SizingWorkload, smallestGPU func(*request) int64) {
	var notes []string
	switch l := rq.userCfg.MemoryLimit; {
	case l != nil && l.Value() > r.MemoryBytes:
		// Below the memoryLimit the claim's config sets: the plugin would refuse it.
	case rq.whole && r.MemoryBytes < smallestGPU(rq):
		// Its compute is the workload's, not one derived from the share's memory, and no
		// less than the computePercent its config sets, which the plugin would refuse.
		comp := int64(r.ComputePercent)
		if p := rq.userCfg.ComputePercent; p != nil {
			comp = max(comp, int64(*p))
		}
		rq.mem, rq.comp, rq.whole = r.MemoryBytes, &comp, false
		notes = append(notes, fmt.Sprintf("memory %s, compute %d%% (asked a whole GPU)", fmtBytes(rq.mem), comp))
	case !rq.whole && r.MemoryBytes < rq.mem:
		notes = append(notes, fmt.Sprintf("memory %s (asked %s)", fmtBytes(r.MemoryBytes), fmtBytes(rq.mem)))
		rq.mem = r.MemoryBytes
	}
	if p := rq.userCfg.ComputePercent; rq.comp != nil && *rq.comp > int64(r.ComputePercent) && (p == nil || int64(*p) <= int64(r.ComputePercent)) {
		notes = append(notes, fmt.Sprintf("compute %d%% (asked %d%%)", r.ComputePercent, *rq.comp))
		v := int64(r.ComputePercent)
		rq.comp = &v
	}
	if len(notes) > 0 {
		rq.sized = fmt.Sprintf("request %q sized by the recommendation for %s %s/%s (%d samples, peak seen %s): %s",
			rq.alt.name, w.Kind, w.Namespace, w.Name, r.Samples, fmtBytes(r.PeakBytes), strings.Join(notes, ", "))
	}
}

// limitsFit says why the claim's memoryLimit or computePercent exceed what a device of the
// request gets on GPU g (mem, comp from size): the plugin would refuse to prepare it. A
// compute of 0 is uncapped, so any computePercent fits it, as in the plugin.
func (rq *request) limitsFit(mem, comp int64, g *model.GPU) (string, string) {
	if l := rq.userCfg.MemoryLimit; l != nil && l.Value() > mem {
		return "less memory than the claim's memoryLimit " + l.String(), fmt.Sprintf("%s gives %s", g.Key(), fmtBytes(mem))
	}
	if p := rq.userCfg.ComputePercent; p != nil && comp > 0 && int64(*p) > comp {
		return fmt.Sprintf("less compute than the claim's computePercent %d", *p), fmt.Sprintf("%s gives %d%%", g.Key(), comp)
	}
	return "", ""
}

// Mode auto's thresholds on a workload's recommended compute (its measured SM activity's
// p90 plus headroom): at or above busyComputePercent it keeps a GPU busy, at or below
// idleComputePercent it is mostly idle. The engine's, which also keeps such workloads from
// bursting.
const (
	busyComputePercent = engine.BusyComputePercent
	idleComputePercent = engine.IdleComputePercent
)

// The reasons sharingMode gives for a mode chosen from measurement.
const (
	busyNote = "keeps a GPU busy (compute recommended at 90% or more), so sharing gains it nothing"
	idleNote = "best-effort and mostly idle (compute recommended at 10% or less): time-slicing costs it little and keeps its faults from its co-tenants, but caps no memory"
)

// sharingMode is the mode a claim gets: the policy's, else the claim's own, else, where its
// workload's use was measured (under sizing Initial or Auto), the mode that use calls for,
// with the reason where it is not plain MPS; else MPS. A busy workload gets busyNote (its
// request is kept whole where it asked a whole GPU); a best-effort, mostly idle one
// time-slicing; every other one, latency-critical always, MPS with caps (its kernels
// concurrent with its co-tenants', its compute share reserved by MPS's thread limit, where
// time-slicing would make them wait for other tenants' slices). Mode auto never follows a
// GPU's other tenants: a claim that names no mode is never time-sliced because another
// tenant chose time-slicing.
func sharingMode(pol policy.Effective, userCfg *api.GpuConfig, measured api.SizingRecommendation, isMeasured bool) (api.SharingMode, string) {
	switch {
	case pol.Mode == api.PolicyModeMPS:
		return api.SharingModeMPS, ""
	case pol.Mode == api.PolicyModeTimeSlicing:
		return api.SharingModeTimeSlicing, ""
	case userCfg.Mode != "":
		return userCfg.Mode, ""
	case !isMeasured:
		return api.SharingModeMPS, ""
	case measured.ComputePercent >= busyComputePercent:
		return api.SharingModeMPS, busyNote
	case pol.Latency == api.LatencyBestEffort && measured.ComputePercent <= idleComputePercent:
		return api.SharingModeTimeSlicing, idleNote
	}
	return api.SharingModeMPS, ""
}

// subDomain is the sub-domain a claim names within its namespace, under every policy: it
// can only subdivide the namespace, so the policy need not restrict it.
func subDomain(userCfg *api.GpuConfig) string {
	if userCfg.IsolationDomain != "" {
		return userCfg.IsolationDomain
	}
	return api.DefaultIsolationDomain
}
