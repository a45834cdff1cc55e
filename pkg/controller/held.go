package controller

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

// room is the memory and compute of g that no tenant holds (a bursting tenant holds its cap).
func (g *gpu) room() usage {
	var held int64
	for _, t := range g.tenants {
		held += t.limit()
	}
	return usage{max(g.memCap-held, 0), max(g.compCap-g.usedComp, 0)}
}

// keptBy reports whether the tenants of namespace ns on g, with extra if it is not nil, turn
// away the claim of another namespace that asks least of a GPU: an MPS share of the standard
// class whose policy allows shared GPUs. The rules are coTenancy's, from the tenants' side.
func (g *gpu) keptBy(ns string, extra *tenant) bool {
	n := len(g.tenants)
	if extra != nil {
		n++
	}
	keeps := func(t *tenant) bool {
		return t.namespace == ns && (t.whole || !t.allowShare || t.mode == api.SharingModeTimeSlicing || t.burstCap > 0 ||
			(t.maxTenants > 0 && n+1 > t.maxTenants) || (t.latency == api.LatencyCritical && n > t.maxCo))
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

// heldRoom is the room on the GPUs a namespace keeps from other namespaces, at one model
// generation.
type heldRoom struct {
	gen   int
	rooms map[*gpu]usage
	sum   usage
	// top and next are the largest and second largest room, per resource: the namespace
	// does not pay for its roomiest GPU.
	top, next usage
}

func (h *heldRoom) add(g *gpu, r usage) {
	h.rooms[g] = r
	h.sum.mem, h.sum.comp = h.sum.mem+r.mem, h.sum.comp+r.comp
	h.top.mem, h.next.mem = top2(h.top.mem, h.next.mem, r.mem)
	h.top.comp, h.next.comp = top2(h.top.comp, h.next.comp, r.comp)
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

// charge is what the held room adds to the namespace's quota use.
func (h heldRoom) charge() usage { return usage{h.sum.mem - h.top.mem, h.sum.comp - h.top.comp} }

// chargeWith is the charge if GPU g had room r and were kept (kept) or not: the same set of
// GPUs but for g.
func (h heldRoom) chargeWith(g *gpu, r usage, kept bool) usage {
	sum, top := h.sum, h.top
	if old, ok := h.rooms[g]; ok {
		sum.mem, sum.comp = sum.mem-old.mem, sum.comp-old.comp
		if old.mem == top.mem {
			top.mem = h.next.mem
		}
		if old.comp == top.comp {
			top.comp = h.next.comp
		}
	}
	if kept {
		sum.mem, sum.comp = sum.mem+r.mem, sum.comp+r.comp
		top.mem, top.comp = max(top.mem, r.mem), max(top.comp, r.comp)
	}
	return usage{sum.mem - top.mem, sum.comp - top.comp}
}

// held is the room namespace ns keeps from other namespaces, memoised until the model
// changes. Caller holds mu.
func (m *model) held(ns string) heldRoom {
	if h, ok := m.heldMemo[ns]; ok && h.gen == m.gen {
		return h
	}
	h := heldRoom{gen: m.gen, rooms: map[*gpu]usage{}}
	if len(m.nsGPUs[ns]) == 0 {
		return h // not memoised: only a namespace with tenants has an entry to drop
	}
	for g := range m.nsGPUs[ns] {
		if g.keptBy(ns, nil) {
			h.add(g, g.room())
		}
	}
	m.heldMemo[ns] = h
	return h
}
