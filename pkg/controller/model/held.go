package model

import (
	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// The quota charges what a namespace holds, not only what its claims take. Where its claims
// keep other namespaces off a GPU (an isolation domain that does not allow shared GPUs, a
// sub-domain, time-slicing, a whole GPU, a critical claim's or a maxTenantsPerGPU co-tenant
// limit reached), the GPU's free room is of no use to anyone else, so the namespace pays for
// it: on every such GPU but the one with the most room, which is where it grows. A namespace
// whose claims fit one GPU pays what they take, as before; four 256Mi claims in four
// sub-domains, or one time-sliced claim per GPU, pay for three GPUs and more.

// Room is the memory and compute of g that no tenant holds (a bursting tenant holds its cap).
func (g *GPU) Room() Usage {
	var held int64
	for _, t := range g.tenants {
		held += t.Limit()
	}
	return Usage{max(g.memCap-held, 0), max(g.compCap-g.usedComp, 0)}
}

// KeptBy reports whether the tenants of namespace ns on g, with extra if it is not nil, turn
// away the claim of another namespace that asks least of a GPU: an MPS share of the standard
// class whose policy allows shared GPUs. The rules are the co-tenancy rules, from the
// tenants' side.
func (g *GPU) KeptBy(ns string, extra *Tenant) bool {
	n := len(g.tenants)
	if extra != nil {
		n++
	}
	keeps := func(t *Tenant) bool {
		return t.Namespace == ns && (t.Whole || !t.AllowShare || t.Mode == api.SharingModeTimeSlicing || t.BurstCap > 0 ||
			(t.MaxTenants > 0 && n+1 > t.MaxTenants) || (t.Latency == api.LatencyCritical && n > t.MaxCo))
	}
	if extra != nil && keeps(extra) {
		return true
	}
	for _, t := range g.tenants {
		if keeps(t) {
			return true
		}
	}
	return false
}

// HeldRoom is the room on the GPUs a namespace keeps from other namespaces, at one model
// generation.
type HeldRoom struct {
	gen   int
	rooms map[*GPU]Usage
	sum   Usage
	// top and next are the largest and second largest room, per resource: the namespace
	// does not pay for its roomiest GPU.
	top, next Usage
}

func (h *HeldRoom) add(g *GPU, r Usage) {
	h.rooms[g] = r
	h.sum.Mem, h.sum.Comp = h.sum.Mem+r.Mem, h.sum.Comp+r.Comp
	h.top.Mem, h.next.Mem = top2(h.top.Mem, h.next.Mem, r.Mem)
	h.top.Comp, h.next.Comp = top2(h.top.Comp, h.next.Comp, r.Comp)
}

func top2(top, next, v int64) (int64, int64) {
	switch {
	case v > top:
		return v, top
	case v > next:
		return top, v
	}
	return top, next
}

// Keeps reports whether g is one of the GPUs the room is held on.
func (h HeldRoom) Keeps(g *GPU) bool {
	_, ok := h.rooms[g]
	return ok
}

// Charge is what the held room adds to the namespace's quota use.
func (h HeldRoom) Charge() Usage { return Usage{h.sum.Mem - h.top.Mem, h.sum.Comp - h.top.Comp} }

// ChargeWith is the charge if GPU g had room r and were kept (kept) or not: the same set of
// GPUs but for g.
func (h HeldRoom) ChargeWith(g *GPU, r Usage, kept bool) Usage {
	sum, top := h.sum, h.top
	if old, ok := h.rooms[g]; ok {
		sum.Mem, sum.Comp = sum.Mem-old.Mem, sum.Comp-old.Comp
		if old.Mem == top.Mem {
			top.Mem = h.next.Mem
		}
		if old.Comp == top.Comp {
			top.Comp = h.next.Comp
		}
	}
	if kept {
		sum.Mem, sum.Comp = sum.Mem+r.Mem, sum.Comp+r.Comp
		top.Mem, top.Comp = max(top.Mem, r.Mem), max(top.Comp, r.Comp)
	}
	return Usage{sum.Mem - top.Mem, sum.Comp - top.Comp}
}

// held is the room namespace ns keeps from other namespaces, memoised until the model
// changes. Caller holds mu.
func (m *Model) held(ns string) HeldRoom {
	if h, ok := m.heldMemo[ns]; ok && h.gen == m.gen {
		return h
	}
	h := HeldRoom{gen: m.gen, rooms: map[*GPU]Usage{}}
	if len(m.nsGPUs[ns]) == 0 {
		return h // not memoised: only a namespace with tenants has an entry to drop
	}
	for g := range m.nsGPUs[ns] {
		if g.KeptBy(ns, nil) {
			h.add(g, g.Room())
		}
	}
	m.heldMemo[ns] = h
	return h
}
