package model

import (
	"cmp"
	"slices"
)

// A namespace granted allowSharedGPU (or isolation none) keeps no namespace granted the same
// off a GPU, so its quota is not charged the room of the GPUs it shares (held.go). Where it
// is the only namespace on a GPU, that GPU is still closed to every claim that does not
// share across namespaces: whole GPUs, exclusive and critical claims, and those of every
// namespace under the default isolation. Its quota does not pay for that room when a share
// is placed, since others may join; once the namespace is alone on more GPUs than its quota
// pays for (the room of every GPU it is alone on but its roomiest, as held.go counts it), the
// room is on loan, and the allocator takes it back for a claim that waits for it.

// Loan is what namespace ns would keep from other namespaces were the GPUs it is alone on
// charged as held room, GPUs in skip aside: Charge is the room of those and of the GPUs it
// keeps (HeldRoom) but the roomiest, per resource; Alone are the GPUs it is alone on
// (published, every tenant ns's, charged by nothing else), in name order. While its quota
// does not pay for Charge, any of them is on loan; once it does, none.
type Loan struct {
	Charge Usage
	Alone  []*GPU
}

// Loan is the loan of namespace ns (see Loan).
func (tx *Tx) Loan(ns string, skip func(*GPU) bool) Loan {
	m := tx.m
	var sum, top Usage
	var alone []*GPU
	for g, count := range m.nsGPUs[ns] {
		if skip(g) {
			continue
		}
		if !g.KeptBy(ns, nil) {
			if !g.known || count != len(g.tenants) {
				continue
			}
			alone = append(alone, g)
		}
		r := g.Room()
		sum.Mem, sum.Comp = sum.Mem+r.Mem, sum.Comp+r.Comp
		top.Mem, top.Comp = max(top.Mem, r.Mem), max(top.Comp, r.Comp)
	}
	slices.SortFunc(alone, func(a, b *GPU) int { return cmp.Compare(a.keyText, b.keyText) })
	return Loan{Charge: Usage{sum.Mem - top.Mem, sum.Comp - top.Comp}, Alone: alone}
}

// SpreadAlone lists, in name order, the namespaces alone on two GPUs or more: only those
// can hold room on loan.
func (tx *Tx) SpreadAlone() []string {
	m := tx.m
	var out []string
	for ns, gpus := range m.nsGPUs {
		n := 0
		for g, count := range gpus {
			if g.known && count == len(g.tenants) {
				if n++; n == 2 {
					out = append(out, ns)
					break
				}
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
