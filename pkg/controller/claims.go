package controller

import (
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// placementOf is the Placement the allocator records for a claim placed under p.
func placementOf(p policy.Effective) *api.Placement {
	return &api.Placement{Policy: p.Name, LatencyClass: p.Latency, MaxCoTenants: int32(p.MaxCoTenants),
		AllowCriticalCoTenants: p.AllowCriticalCoTenants, MaxTenantsPerGPU: int32(p.MaxTenants), AllowSharedGPU: p.AllowSharedGPU}
}

// PlacedByAllocator reports whether the allocator placed the claim (api.PlacedByAllocator,
// which the kubelet plugin asks too).
func PlacedByAllocator(driver string, claim *resourceapi.ResourceClaim) bool {
	return api.PlacedByAllocator(driver, claim)
}

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
