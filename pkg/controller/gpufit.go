package controller

import (
	"fmt"
	"math"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// gpuFits says why GPU g cannot take one device of the request ("" if it can), with an
// example for the waiting message; own is what the claim's earlier requests hold. The
// request's selectors were evaluated before (gather).
func (dc *decider) gpuFits(tx *model.Tx, in *input, own model.Usage, rq *request, g *model.GPU) (string, string) {
	switch ok, failed, known := in.selectors[rq.alt.name].At(g.KeyText(), g.Version()); {
	case !known:
		// Published or changed since the claim's selectors were evaluated: the change
		// started a new pass, which evaluates them on it.
		return "device selectors not evaluated on it yet", ""
	case failed != "":
		return "device selector cannot be evaluated", fmt.Sprintf("%s: %s", g.Key(), failed)
	case !ok:
		return "device selectors do not match", ""
	}
	for _, t := range g.Taints() {
		if !tolerated(rq.alt.tolerations, t) {
			return "device taint not tolerated", fmt.Sprintf("%s: %s=%s:%s", g.Key(), t.Key, t.Value, t.Effect)
		}
	}
	mem, comp := rq.size(in.pol, g)
	if mem > g.MemCap() {
		return "GPU too small", fmt.Sprintf("%s has %s", g.Key(), fmtBytes(g.MemCap()))
	}
	if why, ex := rq.limitsFit(mem, comp, g); why != "" {
		return why, ex
	}
	for t := range g.Tenants() {
		if t.Whole {
			return "held whole by another claim", ""
		}
	}
	if rq.whole && g.NumTenants() > 0 {
		return "not empty (a whole GPU was asked)", ""
	}
	if g.UsedMem()+mem > g.MemCap() {
		return "not enough free memory", fmt.Sprintf("%s has %s free", g.Key(), fmtBytes(g.MemCap()-g.UsedMem()))
	}
	if g.UsedComp()+comp > g.CompCap() {
		return "not enough free compute", fmt.Sprintf("%s has %d%% free", g.Key(), g.CompCap()-g.UsedComp())
	}
	if why, ex := dc.quotaFits(tx, in, own, rq, g, mem, max(mem, rq.capOn(g, mem)), comp); why != "" {
		return why, ex
	}
	if why, ex := coTenancy(in, rq, g); why != "" {
		return why, ex
	}
	if rq.capOn(g, mem) > 0 {
		if dc.burst.IsDraining(g.Key()) {
			return "being emptied by sizing Auto: its bursting tenants move to GPUs in use", g.Key().String()
		}
		return burstAdmits(dc.burst, g, rq.burstFor, dc.cfg.Sizing.Headroom, dc.now())
	}
	return "", ""
}

// coTenancy checks the policy's co-tenancy rules, the claim's and its future co-tenants'.
func coTenancy(in *input, rq *request, g *model.GPU) (string, string) {
	p := in.pol
	return g.Admits(&model.Tenant{Namespace: in.claim.Namespace, Domain: rq.domain, Mode: rq.mode, BurstCap: rq.burstCap,
		Latency: p.Latency, MaxCo: p.MaxCoTenants, AllowCrit: p.AllowCriticalCoTenants, MaxTenants: p.MaxTenants, AllowShare: p.AllowSharedGPU})
}

// size is what GPU g would give the request: all of it for a whole GPU; else the memory
// asked, and the compute asked, derived from memory, or the policy's default.
func (rq *request) size(pol policy.Effective, g *model.GPU) (mem, comp int64) {
	if rq.whole {
		return g.MemCap(), g.CompCap()
	}
	mem = rq.mem
	switch {
	case rq.comp != nil:
		comp = *rq.comp
	case pol.ComputeFromMemory && g.MemCap() > 0:
		comp = int64(math.Ceil(float64(mem) * 100 / float64(g.MemCap())))
	default:
		comp = pol.DefaultCompute
	}
	return mem, min(comp, g.CompCap())
}

// tolerated says whether a new claim may be placed on a device with taint t. A toleration
// of a NoExecute taint for a while only (tolerationSeconds) lets a running pod stay that
// long; a claim placed there would be evicted once it ran out, so it does not count: the
// replacements of pods evicted from a faulty GPU go elsewhere, not back to it.
func tolerated(tols []resourceapi.DeviceToleration, t resourceapi.DeviceTaint) bool {
	for _, tol := range tols {
		if tol.Key != "" && tol.Key != t.Key {
			continue
		}
		if tol.Effect != "" && tol.Effect != t.Effect {
			continue
		}
		if t.Effect == resourceapi.DeviceTaintEffectNoExecute && tol.TolerationSeconds != nil {
			continue
		}
		switch tol.Operator {
		case resourceapi.DeviceTolerationOpExists:
			return true
		case resourceapi.DeviceTolerationOpEqual, "":
			if tol.Value == t.Value {
				return true
			}
		}
	}
	return false
}
