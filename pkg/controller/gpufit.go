package controller

import (
	"context"
	"fmt"
	"math"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// gpuFits says why GPU g cannot take one device of the request ("" if it can), with an
// example for the waiting message; own is what the claim's earlier requests hold. Caller
// holds the model's lock.
func (c *Controller) gpuFits(ctx context.Context, in *input, own usage, rq *request, sels []selRef, g *gpu) (string, string) {
	if ok, failed := c.selectorsMatch(ctx, g, sels); !ok {
		if failed != "" {
			return "device selector cannot be evaluated", fmt.Sprintf("%s: %s", g.key, failed)
		}
		return "device selectors do not match", ""
	}
	for _, t := range g.taints {
		if !tolerated(rq.alt.tolerations, t) {
			return "device taint not tolerated", fmt.Sprintf("%s: %s=%s:%s", g.key, t.Key, t.Value, t.Effect)
		}
	}
	mem, comp := rq.size(in.pol, g)
	if mem > g.memCap {
		return "GPU too small", fmt.Sprintf("%s has %s", g.key, fmtBytes(g.memCap))
	}
	if why, ex := rq.limitsFit(mem, comp, g); why != "" {
		return why, ex
	}
	for _, t := range g.tenants {
		if t.whole {
			return "held whole by another claim", ""
		}
	}
	if rq.whole && len(g.tenants) > 0 {
		return "not empty (a whole GPU was asked)", ""
	}
	if g.usedMem+mem > g.memCap {
		return "not enough free memory", fmt.Sprintf("%s has %s free", g.key, fmtBytes(g.memCap-g.usedMem))
	}
	if g.usedComp+comp > g.compCap {
		return "not enough free compute", fmt.Sprintf("%s has %d%% free", g.key, g.compCap-g.usedComp)
	}
	if why := c.quotaFits(in, own, rq, max(mem, rq.capOn(g, mem)), comp); why != "" {
		return why, ""
	}
	if why, ex := coTenancy(in, rq, g); why != "" {
		return why, ex
	}
	if rq.capOn(g, mem) > 0 {
		if c.burst.isDraining(g.key) {
			return "being emptied by sizing Auto: its bursting tenants move to GPUs in use", g.key.String()
		}
		return c.burst.admits(g, rq.burstFor, c.cfg.Sizing.Headroom, c.now())
	}
	return "", ""
}

// coTenancy checks the policy's co-tenancy rules, the claim's and its future co-tenants'.
func coTenancy(in *input, rq *request, g *gpu) (string, string) {
	p := in.pol
	n := len(g.tenants) + 1
	if p.MaxTenants > 0 && n > p.MaxTenants {
		return "at the policy's maxTenantsPerGPU", fmt.Sprintf("%s has %d tenants", g.key, n-1)
	}
	if p.Latency == api.LatencyCritical && len(g.tenants) > p.MaxCoTenants {
		return "more co-tenants than a critical claim allows", fmt.Sprintf("%s has %d, maxCoTenants %d", g.key, len(g.tenants), p.MaxCoTenants)
	}
	for _, t := range g.tenants {
		if t.maxTenants > 0 && n > t.maxTenants {
			return "at a tenant's maxTenantsPerGPU", ""
		}
		if t.latency == api.LatencyCritical {
			if p.Latency == api.LatencyCritical && (!p.AllowCriticalCoTenants || !t.allowCrit) {
				return "holds another critical claim", t.key
			}
			if len(g.tenants) > t.maxCo {
				return "a critical tenant allows no more co-tenants", t.key
			}
		}
		if t.domain != rq.domain && (!p.AllowSharedGPU || !t.allowShare) {
			return "isolation: used by another namespace or isolation domain", ""
		}
		if (t.burstCap > 0) != (rq.burstCap > 0) {
			return "bursting and non-bursting shares do not share a GPU", t.key
		}
		if t.mode != "" && t.mode != rq.mode {
			return "its tenants use another sharing mode", fmt.Sprintf("%s is %s, the claim %s", g.key, t.mode, rq.mode)
		}
	}
	return "", ""
}

// size is what GPU g would give the request: all of it for a whole GPU; else the memory
// asked, and the compute asked, derived from memory, or the policy's default.
func (rq *request) size(pol policy.Effective, g *gpu) (mem, comp int64) {
	if rq.whole {
		return g.memCap, g.compCap
	}
	mem = rq.mem
	switch {
	case rq.comp != nil:
		comp = *rq.comp
	case pol.ComputeFromMemory && g.memCap > 0:
		comp = int64(math.Ceil(float64(mem) * 100 / float64(g.memCap)))
	default:
		comp = pol.DefaultCompute
	}
	return mem, min(comp, g.compCap)
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

// selRef is a CEL selector interned for a decision: its expression and its index in
// every GPU's memo.
type selRef struct {
	id   int
	expr string
}

// selectorTable interns CEL selector expressions for the per-GPU memo; gen changes when it
// starts over. It belongs to the model and shares its lock.
type selectorTable struct {
	ids  map[string]int
	errs map[int]string // why a selector failed to evaluate: kept once per selector, not per GPU
	gen  int
}

const maxSelectors = 1024

// refs interns the class's and the request's CEL selectors, once per decision, so that the
// per-GPU check is an index, not a string comparison per expression and GPU.
func (t *selectorTable) refs(lists ...[]resourceapi.DeviceSelector) []selRef {
	var out []selRef
	for _, sels := range lists {
		for _, s := range sels {
			if s.CEL == nil {
				continue
			}
			id, ok := t.ids[s.CEL.Expression]
			if !ok {
				if len(t.ids) >= maxSelectors {
					// Many distinct per-request selectors: start over, and let every
					// GPU's memo go stale with the old generation.
					clear(t.ids)
					clear(t.errs)
					t.gen++
				}
				id = len(t.ids)
				t.ids[s.CEL.Expression] = id
			}
			out = append(out, selRef{id: id, expr: s.CEL.Expression})
		}
	}
	return out
}

// selectorsMatch evaluates interned selectors on a device, memoised per device. A selector
// that fails to evaluate does not match; then failed is the selector and its error, as
// kube-scheduler reports them. Caller holds the model's lock.
func (c *Controller) selectorsMatch(ctx context.Context, g *gpu, sels []selRef) (ok bool, failed string) {
	t := &c.model.selectors
	if g.selGen != t.gen {
		g.sel, g.selGen = g.sel[:0], t.gen
	}
	for _, s := range sels {
		for len(g.sel) <= s.id {
			g.sel = append(g.sel, selUnknown)
		}
		if g.sel[s.id] == selUnknown {
			g.sel[s.id] = c.evalSelector(ctx, g, s)
		}
		switch g.sel[s.id] {
		case selYes:
		case selErr:
			return false, fmt.Sprintf("selector `%s`: %s", s.expr, t.errs[s.id])
		default:
			return false, ""
		}
	}
	return true, ""
}

func (c *Controller) evalSelector(ctx context.Context, g *gpu, s selRef) selVerdict {
	res := c.cel.GetOrCompile(s.expr)
	var err error
	ok := false
	if res.Error != nil {
		err = fmt.Errorf("CEL compile error: %w", res.Error)
	} else if ok, _, err = res.DeviceMatches(ctx, cel.Device{Driver: c.cfg.DriverName, Attributes: g.attrs, Capacity: g.capacity, AllowMultipleAllocations: ptr.To(true)}); err != nil {
		err = fmt.Errorf("CEL runtime error: %w", err)
	}
	switch {
	case err != nil:
		t := &c.model.selectors
		if _, seen := t.errs[s.id]; !seen {
			t.errs[s.id] = err.Error()
		}
		return selErr
	case ok:
		return selYes
	}
	return selNo
}
