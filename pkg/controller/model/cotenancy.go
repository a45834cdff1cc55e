package model

import (
	"fmt"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// ReasonIsolation is why a GPU turns away a share of another isolation domain.
const ReasonIsolation = "isolation: used by another namespace or isolation domain"

// Admits says why g's tenants and share t may not be together ("" if they may), with an
// example: the co-tenancy rules, t's (its policy's) and its would-be co-tenants'. The
// allocator asks it of a new share and of a share it would move; t is not among g's
// tenants. Another namespace's claim is never named in the example.
func (g *GPU) Admits(t *Tenant) (string, string) {
	n := len(g.tenants) + 1
	if t.MaxTenants > 0 && n > t.MaxTenants {
		return "at the policy's maxTenantsPerGPU", fmt.Sprintf("%s has %d tenants", g.key, n-1)
	}
	if t.Latency == api.LatencyCritical && len(g.tenants) > t.MaxCo {
		return "more co-tenants than a critical claim allows", fmt.Sprintf("%s has %d, maxCoTenants %d", g.key, len(g.tenants), t.MaxCo)
	}
	for _, o := range g.tenants {
		ex := ""
		if o.Namespace == t.Namespace {
			ex = o.Key
		}
		if o.MaxTenants > 0 && n > o.MaxTenants {
			return "at a tenant's maxTenantsPerGPU", ""
		}
		if o.Latency == api.LatencyCritical {
			if t.Latency == api.LatencyCritical && (!t.AllowCrit || !o.AllowCrit) {
				return "holds another critical claim", ex
			}
			if len(g.tenants) > o.MaxCo {
				return "a critical tenant allows no more co-tenants", ex
			}
		}
		if o.Domain != t.Domain && (!t.AllowShare || !o.AllowShare) {
			return ReasonIsolation, ""
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
