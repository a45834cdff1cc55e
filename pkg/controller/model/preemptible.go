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

// Preemptible lists up to max published GPUs whose every share is of a namespace other than
// ns, lets any namespace granted allowSharedGPU join (so its room is not charged), is one
// movable allows, and would fit, under the co-tenancy rules, on a published, untainted GPU
// where its namespace has shares already (one share per GPU, none that avoid names; of those,
// the besideTries with the most free memory). It looks from the from'th of the GPUs of
// namespaces on two GPUs or more, in name order, round to the start; next is where the next
// call looks from. What the shares' selectors or pods' nodes would allow is not asked: the
// tenant writes those, and pinning shares apart is what this takes back.
func (tx *Tx) Preemptible(ns string, avoid func(*GPU) bool, movable func(*Tenant) bool, from, max int) (out []Preemptible, next int) {
	m := tx.m
	var all []*GPU
	seen := map[*GPU]bool{}
	for n, gpus := range m.nsGPUs {
		if n == ns || len(gpus) < 2 {
			continue // a namespace on one GPU has nowhere to move to
		}
		for g := range gpus {
			if !seen[g] {
				seen[g] = true
				all = append(all, g)
			}
		}
	}
	if len(all) == 0 {
		return nil, 0
	}
	slices.SortFunc(all, func(a, b *GPU) int { return cmp.Compare(a.keyText, b.keyText) })
	b := besides{m: m, avoid: avoid, of: map[string][]*GPU{}}
	start := from % len(all)
	for i := range all {
		g := all[(start+i)%len(all)]
		if moves, ok := b.movesOff(g, ns, movable); ok {
			out = append(out, Preemptible{GPU: g, Moves: moves})
			if len(out) == max {
				return out, start + i + 1
			}
		}
	}
	return out, start + len(all)
}

// besideTries is how many of a namespace's GPUs, those with the most free memory, a share is
// tried on: a bound on the work per share, however many GPUs the namespace holds.
const besideTries = 8

// besides finds where shares would fit beside their namespace's others, within one call of
// Preemptible. Caller holds mu.
type besides struct {
	m     *Model
	avoid func(*GPU) bool
	of    map[string][]*GPU // per namespace, its published, untainted GPUs not avoided, roomiest first
}

func (b *besides) targets(ns string) []*GPU {
	if t, ok := b.of[ns]; ok {
		return t
	}
	type roomy struct {
		g   *GPU
		mem int64
	}
	var rs []roomy
	for h := range b.m.nsGPUs[ns] {
		if h.known && len(h.taints) == 0 && !b.avoid(h) {
			rs = append(rs, roomy{h, h.Room().Mem})
		}
	}
	slices.SortFunc(rs, func(x, y roomy) int { return cmp.Or(cmp.Compare(y.mem, x.mem), cmp.Compare(x.g.keyText, y.g.keyText)) })
	t := make([]*GPU, len(rs))
	for i, r := range rs {
		t[i] = r.g
	}
	b.of[ns] = t
	return t
}

// movesOff finds, for each share of g, a GPU to fit on beside its namespace's other shares.
func (b *besides) movesOff(g *GPU, ns string, movable func(*Tenant) bool) (map[types.UID]*GPU, bool) {
	if !g.known || len(g.tenants) == 0 || b.avoid(g) {
		return nil, false
	}
	moves := map[types.UID]*GPU{}
	used := map[*GPU]bool{}
	for _, t := range g.tenants {
		if t.Namespace == ns || g.KeptBy(t.Namespace, nil) || !movable(t) {
			return nil, false
		}
		var to *GPU
		tried := 0
		for _, h := range b.targets(t.Namespace) {
			if h == g || used[h] {
				continue
			}
			if tried++; tried > besideTries {
				break
			}
			if h.fitsBeside(t) {
				to = h
				break
			}
		}
		if to == nil {
			return nil, false
		}
		moves[t.ShareID], used[to] = to, true
	}
	return moves, true
}

// fitsBeside reports whether share t, of another GPU, would fit on g: room for what t
// holds, and the co-tenancy rules.
func (g *GPU) fitsBeside(t *Tenant) bool {
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
