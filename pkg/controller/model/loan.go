package model

import (
	"cmp"
	"slices"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// A namespace granted allowSharedGPU (or isolation none) keeps no namespace granted the same
// off a GPU, so its quota is not charged the room of the GPUs it shares (held.go). Yet a GPU
// that only such namespaces use is closed to every claim that does not share across
// namespaces: whole GPUs, exclusive and critical claims, and those of every namespace under
// the default isolation. Its quota does not pay for that room when a share is placed, since
// others may join, and the room becomes closed only as they leave; once the namespace holds
// more such room than its quota pays for (counted as held.go counts held room: all but the
// roomiest GPU's), the room is on loan, and the allocator takes it back for a claim that
// waits for it.

// Loan is what namespace ns would keep from other namespaces were the GPUs it shares only
// with namespaces that allow shared GPUs charged as held room, GPUs in skip aside: Charge
// is the room of those and of the GPUs it keeps (HeldRoom) but the roomiest, per resource;
// Open are those GPUs (published, kept by no namespace), in name order. While its quota does
// not pay for Charge, its room on them is on loan; once it does, none is.
type Loan struct {
	Charge Usage
	Open   []*GPU
}

// Loan is the loan of namespace ns (see Loan).
func (tx *Tx) Loan(ns string, skip func(*GPU) bool) Loan {
	m := tx.m
	var sum, top Usage
	var open []*GPU
	for g := range m.nsGPUs[ns] {
		if skip(g) {
			continue
		}
		if !g.KeptBy(ns, nil) {
			if !m.open(g) {
				continue
			}
			open = append(open, g)
		}
		r := g.Room()
		sum.Mem, sum.Comp = sum.Mem+r.Mem, sum.Comp+r.Comp
		top.Mem, top.Comp = max(top.Mem, r.Mem), max(top.Comp, r.Comp)
	}
	slices.SortFunc(open, func(a, b *GPU) int { return cmp.Compare(a.keyText, b.keyText) })
	return Loan{Charge: Usage{sum.Mem - top.Mem, sum.Comp - top.Comp}, Open: open}
}

// open reports whether g is published, used, and kept by no namespace on it: only claims
// that share across namespaces may join it. A GPU with a critical tenant is not: the
// allocator itself spreads critical claims onto the emptiest GPUs, so their namespace did not
// choose the room beside them, and what is taken back would be spread again. Caller holds mu.
func (m *Model) open(g *GPU) bool {
	if !g.known || len(g.tenants) == 0 {
		return false
	}
	seen := map[string]bool{}
	for _, t := range g.tenants {
		if t.Latency == api.LatencyCritical {
			return false
		}
		if !seen[t.Namespace] {
			seen[t.Namespace] = true
			if g.KeptBy(t.Namespace, nil) {
				return false
			}
		}
	}
	return true
}

// Namespaces are the namespaces with shares on g.
func (g *GPU) Namespaces() []string {
	var out []string
	for _, t := range g.tenants {
		if !slices.Contains(out, t.Namespace) {
			out = append(out, t.Namespace)
		}
	}
	return out
}

// SpreadOpen lists, in name order, the namespaces on two GPUs or more, one of them open (see
// open): only those can hold room on loan.
func (tx *Tx) SpreadOpen() []string {
	m := tx.m
	var out []string
	for ns, gpus := range m.nsGPUs {
		if len(gpus) < 2 {
			continue
		}
		for g := range gpus {
			if m.open(g) {
				out = append(out, ns)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// Without runs fn with the claims named by keys taken out of the model, and puts them back
// after: what a decision would do once they are gone. fn must give back what it reserves.
// A claim with a share on a GPU no slice publishes is left in (taking it out would forget
// that GPU).
func (tx *Tx) Without(keys []string, fn func()) {
	m := tx.m
	var out []*Claim
	for _, k := range keys {
		rec := m.claims[k]
		if rec == nil || slices.ContainsFunc(rec.shares, func(s share) bool { return !s.gpu.known }) {
			continue
		}
		out = append(out, m.remove(k))
	}
	defer func() {
		for _, rec := range out {
			m.add(rec)
		}
	}()
	fn()
}

// besideTries is how many of a namespace's GPUs, those with the most free memory, a share is
// tried on: a bound on the work per share, however many GPUs the namespace holds.
const besideTries = 8

// Mover says whether shares taken off GPUs would fit beside their namespaces' other shares,
// within one transaction.
type Mover struct {
	tx     *Tx
	usable func(*GPU) bool
	// paysCompute says whether a namespace's quota charges compute: where it does not, the
	// compute a share asks does not keep it from moving.
	paysCompute func(ns string) bool
	of          map[string][]*GPU             // per namespace, its usable GPUs with the most free memory
	room        map[*GPU]Usage                // each GPU's room, worked out once
	others      map[*GPU]map[string][]*Tenant // a GPU's tenants of namespaces other than one
	// Visited counts the shares and GPUs looked at: the work a plan charges its claim.
	Visited int
}

// Mover is a Mover onto the GPUs usable allows (published and untainted ones only).
func (tx *Tx) Mover(usable func(*GPU) bool, paysCompute func(ns string) bool) *Mover {
	return &Mover{tx: tx, usable: usable, paysCompute: paysCompute, of: map[string][]*GPU{}, room: map[*GPU]Usage{},
		others: map[*GPU]map[string][]*Tenant{}}
}

// othersOn are g's tenants of namespaces other than ns, listed once.
func (mv *Mover) othersOn(g *GPU, ns string) []*Tenant {
	if o, ok := mv.others[g][ns]; ok {
		return o
	}
	var o []*Tenant
	for _, t := range g.tenants {
		if t.Namespace != ns {
			o = append(o, t)
		}
	}
	mv.Visited += len(g.tenants)
	if mv.others[g] == nil {
		mv.others[g] = map[string][]*Tenant{}
	}
	mv.others[g][ns] = o
	return o
}

func (mv *Mover) roomOf(g *GPU) Usage {
	r, ok := mv.room[g]
	if !ok {
		r = g.Room()
		mv.room[g] = r
		mv.Visited += len(g.tenants)
	}
	return r
}

func (mv *Mover) targets(ns string) []*GPU {
	if t, ok := mv.of[ns]; ok {
		return t
	}
	var t []*GPU
	for h := range mv.tx.m.nsGPUs[ns] {
		mv.Visited++
		if !h.known || len(h.taints) > 0 || !mv.usable(h) {
			continue
		}
		r := mv.roomOf(h).Mem
		i := len(t)
		for i > 0 && (mv.roomOf(t[i-1]).Mem < r || (mv.roomOf(t[i-1]).Mem == r && t[i-1].keyText > h.keyText)) {
			i--
		}
		if i < besideTries {
			t = slices.Insert(t, i, h)
			if len(t) > besideTries {
				t = t[:besideTries]
			}
		}
	}
	mv.of[ns] = t
	return t
}

// Movable reports whether every share on the GPUs gs would fit beside its own namespace's
// shares on another of its GPUs (not one of gs), the room each takes counted against the
// next: what is taken back from them then only moves shares together, and a namespace whose
// shares other namespaces' tenants keep apart keeps its GPUs. What the namespace chose itself
// does not keep its shares apart: the co-tenancy rules among its own shares
// (maxTenantsPerGPU, a mix of modes), and compute its quota does not charge; nor do the shares'
// selectors or pods' nodes, which the tenant writes. A share kept apart by those waits for
// room when placed again.
func (mv *Mover) Movable(gs ...*GPU) bool {
	taken, moved := map[*GPU]Usage{}, map[*GPU]int{}
	for _, g := range gs {
		for _, t := range g.tenants {
			mv.Visited++
			placed := false
			for _, h := range mv.targets(t.Namespace) {
				if slices.Contains(gs, h) {
					continue
				}
				room, used := mv.roomOf(h), taken[h]
				if room.Mem-used.Mem < t.Limit() || (mv.paysCompute(t.Namespace) && room.Comp-used.Comp < t.Comp) {
					continue
				}
				// Other namespaces' tenants there, and their rules; none on most targets.
				if n := len(h.tenants) - mv.tx.m.nsGPUs[t.Namespace][h]; n > 0 {
					others := mv.othersOn(h, t.Namespace)
					mv.Visited += len(others)
					if why, _ := h.admits(t, n, len(h.tenants)+moved[h], slices.Values(others)); why != "" {
						continue
					}
				}
				taken[h] = Usage{used.Mem + t.Limit(), used.Comp + t.Comp}
				moved[h]++
				placed = true
				break
			}
			if !placed {
				return false
			}
		}
	}
	return true
}
