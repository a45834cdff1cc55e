package model

import (
	"fmt"
	"iter"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Admits says why g's tenants and share t may not be together ("" if they may), with an
// example: the co-tenancy rules, t's (its policy's) and its would-be co-tenants'. The
// allocator asks it of a new share and of a share it would move; t is not among g's tenants.
// The example names a co-tenant's claim only where it is of t's namespace, else the GPU: a
// claim's status and events are read by its namespace.
func (g *GPU) Admits(t *Tenant) (string, string) {
	n := len(g.tenants)
	return g.admits(t, n, n, g.Tenants())
}

// admits is Admits with only the rules of the tenants among asked: t's limits count n
// tenants, theirs all the GPU would hold, all.
func (g *GPU) admits(t *Tenant, n, all int, among iter.Seq[*Tenant]) (string, string) {
	if t.MaxTenants > 0 && n+1 > t.MaxTenants {
		return "at the policy's maxTenantsPerGPU", fmt.Sprintf("%s has %d tenants", g.key, n)
	}
	if t.Latency == api.LatencyCritical && n > t.MaxCo {
		return "more co-tenants than a critical claim allows", fmt.Sprintf("%s has %d, maxCoTenants %d", g.key, n, t.MaxCo)
	}
	n = all
	for o := range among {
		ex := g.keyText
		if o.Namespace == t.Namespace {
			ex = o.Key
		}
		if o.MaxTenants > 0 && n+1 > o.MaxTenants {
			return "at a tenant's maxTenantsPerGPU", ""
		}
		if o.Latency == api.LatencyCritical {
			if t.Latency == api.LatencyCritical && (!t.AllowCrit || !o.AllowCrit) {
				return "holds another critical claim", ex
			}
			if n > o.MaxCo {
				return "a critical tenant allows no more co-tenants", ex
			}
		}
		if o.Domain != t.Domain && (!t.AllowShare || !o.AllowShare) {
			return "isolation: used by another namespace or isolation domain", ""
		}
		if (o.BurstCap > 0) != (t.BurstCap > 0) {
			return "bursting and non-bursting shares do not share a GPU", ex
		}
		if o.Mode != "" && o.Mode != t.Mode {
			return "its tenants use another sharing mode", fmt.Sprintf("%s is %s, the claim %s", g.key, o.Mode, t.Mode)
		}
	}
	return "", ""
}
