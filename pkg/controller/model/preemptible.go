package model

import (
	"cmp"
	"slices"

	"k8s.io/apimachinery/pkg/types"
)

// A namespace granted allowSharedGPU (or isolation none) keeps no namespace granted the same
// off its GPUs, so its quota pays only what its shares ask (held.go charges no room for
// them). Yet it keeps off every claim that does not share across namespaces: whole GPUs,
// exclusive and critical claims, and those of every namespace under the default isolation.
// Where its shares on a GPU would fit beside its own shares on its other GPUs, that GPU is
// held for nothing: it is taken back when another namespace's claim waits for it (the
// allocator's preemption).

// Preemptible is a GPU whose shares would each fit beside their namespace's own shares on
// another GPU: Moves maps each share to that GPU.
type Preemptible struct {
	GPU   *GPU
	Moves map[types.UID]*GPU
}

// Preemptible lists, by name, the published GPUs whose every share is of a namespace other
// than ns, lets any namespace granted allowSharedGPU join (so its room is not charged), is
// one movable allows, and would fit, under the co-tenancy rules, on a published, untainted
// GPU where its namespace has shares already (one share per GPU, none that avoid names).
// What the shares' selectors or pods' nodes would allow is not asked: the tenant writes
// those, and pinning shares apart is what this takes back.
func (tx *Tx) Preemptible(ns string, avoid func(*GPU) bool, movable func(*Tenant) bool) []Preemptible {
	m := tx.m
	var out []Preemptible
	seen := map[*GPU]bool{}
	for n, gpus := range m.nsGPUs {
		if n == ns || len(gpus) < 2 {
			continue // a namespace on one GPU has nowhere to move to
		}
		for g := range gpus {
			if seen[g] {
				continue
			}
			seen[g] = true
			if moves, ok := m.movesOff(g, ns, avoid, movable); ok {
				out = append(out, Preemptible{GPU: g, Moves: moves})
			}
		}
	}
	slices.SortFunc(out, func(a, b Preemptible) int { return cmp.Compare(a.GPU.keyText, b.GPU.keyText) })
	return out
}

// movesOff finds, for each share of g, a GPU to fit on beside its namespace's other shares
// (Preemptible). Caller holds mu.
func (m *Model) movesOff(g *GPU, ns string, avoid func(*GPU) bool, movable func(*Tenant) bool) (map[types.UID]*GPU, bool) {
	if !g.known || len(g.tenants) == 0 || avoid(g) {
		return nil, false
	}
	moves := map[types.UID]*GPU{}
	used := map[*GPU]bool{}
	for _, t := range g.tenants {
		if t.Namespace == ns || g.KeptBy(t.Namespace, nil) || !movable(t) {
			return nil, false
		}
		var to *GPU
		for h := range m.nsGPUs[t.Namespace] {
			if h != g && !used[h] && h.fitsBeside(t) && !avoid(h) && (to == nil || h.keyText < to.keyText) {
				to = h
			}
		}
		if to == nil {
			return nil, false
		}
		moves[t.ShareID], used[to] = to, true
	}
	return moves, true
}

// fitsBeside reports whether share t, of another GPU, would fit on g: published, untainted,
// room for what t holds, and the co-tenancy rules.
func (g *GPU) fitsBeside(t *Tenant) bool {
	if !g.known || len(g.taints) > 0 {
		return false
	}
	room := g.Room()
	if room.Mem < t.Limit() || room.Comp < t.Comp {
		return false
	}
	why, _ := g.Admits(t)
	return why == ""
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
