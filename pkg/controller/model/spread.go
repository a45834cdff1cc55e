package model

import (
	"cmp"
	"slices"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// A namespace granted allowSharedGPU (or isolation none) keeps no namespace granted the same
// off its GPUs, so its quota pays only what its shares ask (held.go charges no room for
// them). Yet it keeps off every claim that does not share across namespaces: whole GPUs,
// exclusive and critical claims, and those of every namespace under the default isolation.
// Where its shares are on more such GPUs than they need, packed, that room is taken back
// when another namespace's claim waits for it (the allocator's preemption). Spread is how
// many GPUs that is.

// Spread is how many GPUs namespace ns holds uncharged beyond those its shares there need:
// on is the GPUs where its shares keep no namespace granted allowSharedGPU off, need is how
// many GPUs of those sizes the same shares take packed first-fit, largest first (within each
// share's co-tenant limits). Where they sit beside other namespaces' shares is not counted:
// the question is what the namespace's own shares need.
type Spread struct{ On, Need int }

// Excess is the GPUs the namespace holds beyond what its shares need.
func (s Spread) Excess() int { return s.On - s.Need }

// spread is Spread for ns, memoised until the model changes. Caller holds mu.
func (m *Model) spread(ns string) Spread {
	if m.spreadMemo.gen != m.gen || m.spreadMemo.of == nil {
		m.spreadMemo.gen, m.spreadMemo.of = m.gen, map[string]Spread{}
	}
	if s, ok := m.spreadMemo.of[ns]; ok {
		return s
	}
	var gpus []*GPU
	var shares []*Tenant
	for g := range m.nsGPUs[ns] {
		if g.KeptBy(ns, nil) {
			continue // charged as held room
		}
		gpus = append(gpus, g)
		for _, t := range g.tenants {
			if t.Namespace == ns {
				shares = append(shares, t)
			}
		}
	}
	s := Spread{On: len(gpus), Need: pack(gpus, shares)}
	m.spreadMemo.of[ns] = s
	return s
}

// pack is how many GPUs, sized as gpus (largest first, then the largest again), shares
// take placed first-fit in decreasing order of memory and compute.
func pack(gpus []*GPU, shares []*Tenant) int {
	if len(shares) == 0 {
		return 0
	}
	// Only sizes matter: GPUs of one size, and shares alike in size and limit, are
	// interchangeable, so the count does not depend on the order among them.
	slices.SortFunc(gpus, func(a, b *GPU) int {
		return cmp.Or(cmp.Compare(b.memCap, a.memCap), cmp.Compare(b.compCap, a.compCap))
	})
	slices.SortFunc(shares, func(a, b *Tenant) int {
		return cmp.Or(cmp.Compare(b.Mem, a.Mem), cmp.Compare(b.Comp, a.Comp), cmp.Compare(coTenantLimit(a), coTenantLimit(b)))
	})
	type bin struct {
		mem, comp int64
		n, limit  int // tenants, and the fewest any of them allows (0: no limit)
	}
	var bins []bin
	for _, t := range shares {
		lim := coTenantLimit(t)
		fits := func(b *bin) bool {
			n := b.n + 1
			return b.mem >= t.Mem && b.comp >= t.Comp && (b.limit == 0 || n <= b.limit) && (lim == 0 || n <= lim)
		}
		i := slices.IndexFunc(bins, func(b bin) bool { return fits(&b) })
		if i < 0 {
			g := gpus[0]
			if len(bins) < len(gpus) {
				g = gpus[len(bins)]
			}
			bins = append(bins, bin{mem: g.memCap, comp: g.compCap})
			i = len(bins) - 1
			if !fits(&bins[i]) {
				bins[i] = bin{n: 1, limit: 1} // larger than its GPU alone (it was placed there): it takes it all
				continue
			}
		}
		b := &bins[i]
		b.mem, b.comp, b.n = b.mem-t.Mem, b.comp-t.Comp, b.n+1
		if lim > 0 && (b.limit == 0 || lim < b.limit) {
			b.limit = lim
		}
	}
	return len(bins)
}

// coTenantLimit is how many tenants a GPU may have at most for t to stay on it (0: any).
func coTenantLimit(t *Tenant) int {
	lim := t.MaxTenants
	if t.Latency == api.LatencyCritical && (lim == 0 || t.MaxCo+1 < lim) {
		lim = t.MaxCo + 1
	}
	return lim
}

// Preemptible lists the published GPUs that only shares of spread namespaces hold, none of
// namespace ns (which would have joined them): shares that keep no namespace granted
// allowSharedGPU off, of namespaces holding more such GPUs than their shares need, less
// taken (those already being taken back from them).
func (tx *Tx) Preemptible(ns string, taken map[string]int) []*GPU {
	m := tx.m
	var out []*GPU
	seen := map[*GPU]bool{}
	for n := range m.nsGPUs {
		if n == ns || m.spread(n).Excess()-taken[n] < 1 {
			continue
		}
		for g := range m.nsGPUs[n] {
			if !seen[g] && g.known && m.preemptibleFor(g, ns, taken) {
				out = append(out, g)
			}
			seen[g] = true
		}
	}
	slices.SortFunc(out, func(a, b *GPU) int { return cmp.Compare(a.keyText, b.keyText) })
	return out
}

// preemptibleFor reports whether every tenant of g is of a spread namespace other than ns
// and keeps no namespace granted allowSharedGPU off. Caller holds mu.
func (m *Model) preemptibleFor(g *GPU, ns string, taken map[string]int) bool {
	for _, t := range g.tenants {
		if t.Namespace == ns || g.KeptBy(t.Namespace, nil) || m.spread(t.Namespace).Excess()-taken[t.Namespace] < 1 {
			return false
		}
	}
	return len(g.tenants) > 0
}

// Spread is namespace ns's Spread.
func (tx *Tx) Spread(ns string) Spread { return tx.m.spread(ns) }

// Without runs fn with the claims named by keys taken out of the model, and puts them back
// after: what a decision would do once they are gone. fn must give back what it reserves.
// A claim with a share on a GPU no slice publishes is left in (taking it out would forget
// that GPU).
func (tx *Tx) Without(keys []string, fn func()) {
	m := tx.m
	// The model after is the model before, so the namespaces' spread computed before holds
	// again: kept, it is not computed anew at every waiting claim's retry.
	spreadBefore, valid := m.spreadMemo, m.spreadMemo.gen == m.gen
	var out []*Claim
	for _, k := range keys {
		rec := tx.m.claims[k]
		if rec == nil || slices.ContainsFunc(rec.shares, func(s share) bool { return !s.gpu.known }) {
			continue
		}
		out = append(out, tx.m.remove(k))
	}
	defer func() {
		for _, rec := range out {
			m.add(rec)
		}
		if valid {
			m.spreadMemo = spreadBefore
			m.spreadMemo.gen = m.gen
		}
	}()
	fn()
}
