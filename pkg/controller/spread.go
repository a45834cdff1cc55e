package controller

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// A namespace whose shares let other namespaces in keeps nothing from their shares, but each
// GPU its shares have to themselves is still closed to whole-GPU, exclusive and critical
// claims. Shares that fit fewer GPUs than they sit on hold the rest for nothing: one small
// share pinned to each GPU (selectors, node affinity, pod anti-affinity) keeps every whole
// GPU of the cluster for a few GiB of quota. So every GPU a namespace is alone on beyond as
// many as its shares need counts against its quota, whole: it is what whole-GPU claims lose. Only
// the state counts, not how it came about: opening a GPU with a large share, joining it with
// a small one and deleting the large one ends where pinning the small one would have. A
// share of another namespace on the GPU ends the charge there; so does the namespace's own
// shares outgrowing fewer GPUs.

// spreadGPU is a GPU that only one namespace's shares use, none of which keeps it.
type spreadGPU struct {
	memCap, compCap int64
	shares          []*tenant
}

// spreadBin is a GPU being filled while packing shares into as few GPUs as they fit.
type spreadBin struct {
	memCap, compCap int64
	mem, comp       int64
	n               int
	maxN            int // 0: no bound
	claims          map[types.UID]bool
}

// beyond packs the shares first-fit decreasing into the largest GPUs first, under the
// co-tenancy rules that bind them among themselves (memory, compute, a claim's devices on
// distinct GPUs, the tenant limits of maxTenantsPerGPU and of a critical class), and returns
// the capacity of the GPUs left empty: what consolidating them would give back. First fit
// may use more GPUs than the best packing, never fewer, and leaves the smallest GPUs empty:
// the charge errs towards too little.
func beyond(gpus []spreadGPU) usage {
	bins := make([]spreadBin, len(gpus))
	for i, g := range gpus {
		bins[i] = spreadBin{memCap: g.memCap, compCap: g.compCap}
	}
	slices.SortStableFunc(bins, func(a, b spreadBin) int {
		return cmp.Or(cmp.Compare(b.memCap, a.memCap), cmp.Compare(b.compCap, a.compCap))
	})
	var shares []*tenant
	for _, g := range gpus {
		shares = append(shares, g.shares...)
	}
	slices.SortStableFunc(shares, func(a, b *tenant) int {
		return cmp.Or(cmp.Compare(b.limit(), a.limit()), cmp.Compare(b.comp, a.comp))
	})
	// bins[:open] have been tried; most memory and compute free on one of them, so that a
	// share too large for all of them opens the next at once (shares that need their GPUs
	// are the common case, and would otherwise try every GPU before them).
	open := 0
	var most usage
	for _, t := range shares {
		i, tried := -1, open
		if t.limit() <= most.mem && t.comp <= most.comp {
			i = slices.IndexFunc(bins[:open], func(b spreadBin) bool { return b.fits(t) })
		}
		if i < 0 {
			j := slices.IndexFunc(bins[open:], func(b spreadBin) bool { return b.fits(t) })
			if j < 0 {
				return usage{} // no smaller packing of them is known: they need where they sit
			}
			i, open = open+j, open+j+1
		}
		b := &bins[i]
		wasMost := i < tried && (b.memCap-b.mem == most.mem || b.compCap-b.comp == most.comp)
		b.add(t)
		if wasMost {
			most = usage{}
			for _, o := range bins[:open] {
				most.mem, most.comp = max(most.mem, o.memCap-o.mem), max(most.comp, o.compCap-o.comp)
			}
		} else {
			most.mem, most.comp = max(most.mem, b.memCap-b.mem), max(most.comp, b.compCap-b.comp)
		}
	}
	var free usage
	for _, b := range bins {
		if b.n == 0 {
			free.mem, free.comp = addSat(free.mem, b.memCap), addSat(free.comp, b.compCap)
		}
	}
	return free
}

// tenantBound is the most tenants a GPU may have with t among them (0: no bound).
func tenantBound(t *tenant) int {
	n := t.maxTenants
	if t.latency == api.LatencyCritical && (n == 0 || t.maxCo+1 < n) {
		n = t.maxCo + 1
	}
	return n
}

func (b spreadBin) fits(t *tenant) bool {
	if b.claims[t.claim] || b.mem+t.limit() > b.memCap || b.comp+t.comp > b.compCap {
		return false
	}
	n := b.n + 1
	bound := tenantBound(t)
	return (b.maxN == 0 || n <= b.maxN) && (bound == 0 || n <= bound)
}

func (b *spreadBin) add(t *tenant) {
	b.mem, b.comp, b.n = b.mem+t.limit(), b.comp+t.comp, b.n+1
	if b.claims == nil {
		b.claims = map[types.UID]bool{}
	}
	b.claims[t.claim] = true
	if bound := tenantBound(t); bound > 0 && (b.maxN == 0 || bound < b.maxN) {
		b.maxN = bound
	}
}

// spreadCharge is what the GPUs a namespace has to itself cost its quota beyond what its
// shares take: the whole of every GPU its shares do not need.
func spreadCharge(gpus []spreadGPU) usage {
	if len(gpus) < 2 {
		return usage{}
	}
	return beyond(gpus)
}

// aloneOn is a GPU that namespace has to itself without keeping it, as the spread charge
// sees it.
type aloneOn struct {
	gpu *gpu
	spreadGPU
}

// alone is whether namespace ns is the only one on g. Caller holds mu.
func (m *model) alone(ns string, g *gpu) bool { return m.nsGPUs[ns][g] == len(g.tenants) }

func spreadOn(g *gpu) spreadGPU {
	return spreadGPU{memCap: g.memCap, compCap: g.compCap, shares: tenantsOf(g)}
}

func tenantsOf(g *gpu) []*tenant {
	out := make([]*tenant, 0, len(g.tenants))
	for _, t := range g.tenants {
		out = append(out, t)
	}
	return out
}

// spreadWith is the namespace's spread charge if count devices of share t, which does not
// keep its GPU, went to g and to GPUs like it: g joins the GPUs the namespace has to itself
// unless another namespace is on it; every further device counts as opening a GPU like g.
// As with the kept room, each GPU the placement core picks passed this check on its own.
// Caller holds mu.
func (m *model) spreadWith(ns string, h heldRoom, g *gpu, t *tenant, count int64, kept bool) usage {
	if !m.alone(ns, g) {
		return h.spread
	}
	gpus := make([]spreadGPU, 0, len(h.alone)+int(count))
	for _, a := range h.alone {
		if a.gpu != g {
			gpus = append(gpus, a.spreadGPU)
		}
	}
	if kept {
		return spreadCharge(gpus) // g's room is kept now, and charged as such
	}
	gpus = append(gpus, spreadGPU{memCap: g.memCap, compCap: g.compCap, shares: append(tenantsOf(g), t)})
	for range count - 1 {
		gpus = append(gpus, spreadGPU{memCap: g.memCap, compCap: g.compCap, shares: []*tenant{t}})
	}
	return spreadCharge(gpus)
}
