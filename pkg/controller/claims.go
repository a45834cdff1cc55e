package controller

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

const (
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
)

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

// allocationConfig reads back the merged config of an allocated request. A config that
// does not decode (an allocation fgpu did not make) counts as the defaults: the plugin
// refuses to prepare it anyway.
func allocationConfig(driver string, cfgs []resourceapi.DeviceAllocationConfiguration, request string) *api.GpuConfig {
	merged, err := api.MergeConfigs(driver, cfgs, request)
	if err != nil {
		merged = &api.GpuConfig{}
	}
	merged.Normalize()
	return merged
}

// domain is an isolation domain: a namespace and a sub-domain of it. Claims share an MPS
// server only within one domain; the sub-domain, which a claim may name, only subdivides its
// own namespace. The plugin derives the MPS server from the same pair (pkg/mps Daemon).
type domain struct{ namespace, sub string }

// String is the domain as the plugin shows it (FGPU_ISOLATION_DOMAIN): "<namespace>/<sub>".
func (d domain) String() string { return d.namespace + "/" + d.sub }

func hasFinalizer(claim *resourceapi.ResourceClaim, f string) bool {
	return slices.Contains(claim.Finalizers, f)
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

// claimKey is namespace/name: the queue's and the model's key for a claim.
func claimKey(claim *resourceapi.ResourceClaim) string { return cache.MetaObjectToName(claim).String() }

// claimKeyIn is the key of the claim named name in namespace ns.
func claimKeyIn(ns, name string) string { return cache.NewObjectName(ns, name).String() }
