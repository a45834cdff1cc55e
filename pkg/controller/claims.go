package controller

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

const (
	capMemory  resourceapi.QualifiedName = "memory"
	capCompute resourceapi.QualifiedName = "compute"

	// Finalizer keeps a claim the allocator placed until it has released its shares.
	Finalizer = "fgpu.dev/allocator"
	// AnnotationAllocatedBy marks a claim the allocator manages.
	AnnotationAllocatedBy = "fgpu.dev/allocated-by"
	// AllocatedByValue is AnnotationAllocatedBy's value.
	AllocatedByValue = "fgpu-allocator"
	// AnnotationTenancy records the co-tenancy rules a placed claim was given, so that
	// they survive a restart of the allocator.
	AnnotationTenancy = "fgpu.dev/tenancy"
	// AnnotationStatus says in words where the claim stands (ResourceClaim status has no
	// conditions).
	AnnotationStatus = "fgpu.dev/status"

	// FenceTaintKey is the taint the plugin puts on devices in allocator mode.
	FenceTaintKey   = "fgpu.dev/allocator"
	FenceTaintValue = "required"

	// MemoryStep is the granularity of memory shares (the devices' requestPolicy step).
	MemoryStep = int64(256) << 20
)

// FenceToleration is the toleration the allocator puts in every result.
func FenceToleration() resourceapi.DeviceToleration {
	return resourceapi.DeviceToleration{Key: FenceTaintKey, Operator: resourceapi.DeviceTolerationOpEqual, Value: FenceTaintValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}
}

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

// tenancy is what AnnotationTenancy records.
type tenancy struct {
	Latency    api.LatencyClass `json:"latency"`
	MaxCo      int              `json:"maxCoTenants,omitempty"`
	AllowCrit  bool             `json:"allowCritical,omitempty"`
	MaxTenants int              `json:"maxTenants,omitempty"`
	AllowShare bool             `json:"allowSharedGPU,omitempty"`
	Policy     string           `json:"policy,omitempty"`
}

func tenancyOf(p policy.Effective) tenancy {
	return tenancy{Latency: p.Latency, MaxCo: p.MaxCoTenants, AllowCrit: p.AllowCriticalCoTenants, MaxTenants: p.MaxTenants, AllowShare: p.AllowSharedGPU, Policy: p.Name}
}

// userConfig merges the fgpu opaque configs of the class and the claim that apply to a
// request, as the plugin will (class first, claim later, later fields override).
func userConfig(driver string, classCfg []resourceapi.DeviceClassConfiguration, claimCfg []resourceapi.DeviceClaimConfiguration, request string) (*api.GpuConfig, error) {
	merged := &api.GpuConfig{}
	apply := func(requests []string, opaque *resourceapi.OpaqueDeviceConfiguration) error {
		if opaque == nil || opaque.Driver != driver || !api.AppliesTo(requests, request) {
			return nil
		}
		cfg, err := api.DecodeGpuConfig(opaque.Parameters.Raw)
		if err != nil {
			return err
		}
		if err := cfg.Validate(); err != nil {
			return err
		}
		merged.Overlay(cfg)
		return nil
	}
	for _, c := range classCfg {
		if err := apply(nil, c.Opaque); err != nil {
			return nil, err
		}
	}
	for _, c := range claimCfg {
		if err := apply(c.Requests, c.Opaque); err != nil {
			return nil, err
		}
	}
	return merged, nil
}

// allocationConfig reads back the merged config of an allocated request.
func allocationConfig(driver string, cfgs []resourceapi.DeviceAllocationConfiguration, request string) *api.GpuConfig {
	merged := &api.GpuConfig{}
	for _, src := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for _, c := range cfgs {
			if c.Source != src || c.Opaque == nil || c.Opaque.Driver != driver || !api.AppliesTo(c.Requests, request) {
				continue
			}
			if cfg, err := api.DecodeGpuConfig(c.Opaque.Parameters.Raw); err == nil {
				merged.Overlay(cfg)
			}
		}
	}
	merged.Normalize()
	return merged
}

// namespaceDomain is the isolation domain of a namespace: a DNS label.
func namespaceDomain(ns string) string {
	d := "ns-" + ns
	if len(d) <= 63 {
		return d
	}
	h := uint32(2166136261)
	for i := 0; i < len(ns); i++ {
		h = (h ^ uint32(ns[i])) * 16777619
	}
	return strings.TrimRight(d[:54], "-") + "-" + strconv.FormatUint(uint64(h), 16)
}

// recordFromClaim turns an allocated claim into the shares it holds. byUs says whether the
// allocator placed it (its tenancy annotation then holds its rules).
func (c *Controller) recordFromClaim(claim *resourceapi.ResourceClaim) *claimRec {
	a := claim.Status.Allocation
	if a == nil {
		return nil
	}
	rec := &claimRec{uid: claim.UID, key: claim.Namespace + "/" + claim.Name, namespace: claim.Namespace}
	byUs := claim.Annotations[AnnotationAllocatedBy] == AllocatedByValue && hasFinalizer(claim, Finalizer)
	ten := tenancy{Latency: api.LatencyStandard}
	if raw, ok := claim.Annotations[AnnotationTenancy]; ok && byUs {
		_ = json.Unmarshal([]byte(raw), &ten)
	}
	for i, r := range a.Devices.Results {
		if r.Driver != c.cfg.DriverName {
			continue
		}
		g := c.st.gpuFor(gpuKey{r.Pool, r.Device})
		t := &tenant{claim: claim.UID, key: rec.key, namespace: claim.Namespace, byUs: byUs,
			latency: ten.Latency, maxCo: ten.MaxCo, allowCrit: ten.AllowCrit, maxTenants: ten.MaxTenants, allowShare: ten.AllowShare}
		if r.ShareID != nil {
			t.shareID = *r.ShareID
		} else {
			t.shareID = types.UID(fmt.Sprintf("%s/%d", claim.UID, i))
		}
		if r.ConsumedCapacity == nil {
			t.whole, t.mem, t.comp = true, g.memCap, g.compCap
		} else {
			m, cp := r.ConsumedCapacity[capMemory], r.ConsumedCapacity[capCompute]
			t.mem, t.comp = m.Value(), cp.Value()
			t.whole = g.known && t.mem >= g.memCap
		}
		cfg := allocationConfig(c.cfg.DriverName, a.Devices.Config, r.Request)
		t.mode, t.domain = cfg.Mode, cfg.IsolationDomain
		rec.shares = append(rec.shares, &tenantAt{gpu: g, t: t})
	}
	if len(rec.shares) == 0 {
		return nil
	}
	return rec
}

func hasFinalizer(claim *resourceapi.ResourceClaim, f string) bool {
	for _, x := range claim.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

func roundUp(v, step int64) int64 {
	if v <= 0 {
		return step
	}
	return (v + step - 1) / step * step
}

func fmtBytes(b int64) string {
	return resource.NewQuantity(b, resource.BinarySI).String()
}

// claimKey is namespace/name: the state's key for a claim.
func claimKey(claim *resourceapi.ResourceClaim) string { return claim.Namespace + "/" + claim.Name }
