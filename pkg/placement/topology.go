package placement

import (
	"encoding/binary"
	"slices"
)

// wire gives node nd its GPUs' groups from their specs, level by level, nearest
// first: NVLink island, PCIe root complex, NUMA node. Group ids are numbered on
// the node by first appearance, so that machines wired alike get equal ids; a
// GPU whose level is unknown gets -1-g, alone in a group of its own. Only the
// levels that group some GPUs, and differently from the level above, are kept:
// the others change no choice. It returns the kept levels as bytes, empty when
// there are none.
func (nd *node) wire(gs []GPUSpec, sig []byte) []byte {
	sig = sig[:0]
	var names []string
	for l := range 3 {
		loc := make([]int32, len(gs))
		names = names[:0]
		shared := false
		for g, s := range gs {
			name := [...]string{s.Island, s.PCIeRoot, s.NUMA}[l]
			if name == "" {
				loc[g] = int32(-1 - g)
				continue
			}
			id := slices.Index(names, name)
			if id < 0 {
				id = len(names)
				names = append(names, name)
			} else {
				shared = true
			}
			loc[g] = int32(id)
		}
		if !shared || len(nd.loc) > 0 && slices.Equal(loc, nd.loc[len(nd.loc)-1]) {
			continue
		}
		nd.loc = append(nd.loc, loc)
		sig = binary.AppendUvarint(sig, uint64(l))
		for _, id := range loc {
			sig = binary.AppendVarint(sig, int64(id))
		}
	}
	return sig
}

// wired reports whether the node's wiring groups any of its GPUs.
func (nd *node) wired() bool { return len(nd.loc) > 0 }

// fitGroup finds the group that best fits k of elig: at the nearest level
// where one group holds k of them, the group holding the fewest (it keeps the
// larger groups whole), ties to the group whose first GPU comes first. ok is
// false where no group holds k.
func (c *Cluster) fitGroup(n int, elig []int, k int) (level int, group int32, ok bool) {
	nd := &c.nodes[n]
	if !nd.wired() || k < 2 {
		return 0, 0, false
	}
	cnt := c.topoCount[:len(nd.gpuCap)]
	for l, loc := range nd.loc {
		clear(cnt)
		for _, g := range elig {
			if id := loc[g]; id >= 0 {
				cnt[id]++
			}
		}
		best := int32(-1)
		for id, m := range cnt {
			if m >= k && (best < 0 || m < cnt[best]) {
				best = int32(id)
			}
		}
		if best >= 0 {
			return l, best, true
		}
	}
	return 0, 0, false
}

// appendGroup appends to out the first k GPUs of elig in group id at level l.
func (c *Cluster) appendGroup(out []int, n int, elig []int, k, l int, id int32) []int {
	loc := c.nodes[n].loc[l]
	for _, g := range elig {
		if k == 0 {
			break
		}
		if loc[g] == id {
			out = append(out, g)
			k--
		}
	}
	return out
}

// leastCrowded returns the GPU of cands (in index order) whose group holds the
// fewest of the GPUs marked in c.topoIn, at the nearest level first, then the
// next; ties go to the first. A request that takes one GPU takes it where it
// breaks up the fewest GPUs a larger request could use together.
func (c *Cluster) leastCrowded(n int, cands []int) int {
	nd := &c.nodes[n]
	if !nd.wired() || len(cands) < 2 {
		return cands[0]
	}
	cnt, in := c.topoCount[:len(nd.gpuCap)], c.topoIn[:len(nd.gpuCap)]
	c.topoCands = append(c.topoCands[:0], cands...)
	left := c.topoCands
	for _, loc := range nd.loc {
		clear(cnt)
		for h, id := range loc {
			if in[h] && id >= 0 {
				cnt[id]++
			}
		}
		fewest, kept := -1, left[:0]
		for _, g := range left {
			m := 0 // a GPU in no group at this level is alone in one
			switch {
			case loc[g] >= 0:
				m = cnt[loc[g]]
			case in[g]:
				m = 1
			}
			switch {
			case fewest < 0 || m < fewest:
				fewest, kept = m, append(kept[:0], g)
			case m == fewest:
				kept = append(kept, g)
			}
		}
		left = kept
		if len(left) == 1 {
			break
		}
	}
	return left[0]
}

// leastCrowdedOf is the GPU of elig whose group holds the fewest of them.
func (c *Cluster) leastCrowdedOf(n int, elig []int) int {
	if !c.nodes[n].wired() {
		return elig[0]
	}
	c.mark(n, elig)
	return c.leastCrowded(n, elig)
}

// mark marks the GPUs gpus of node n in c.topoIn for leastCrowded.
func (c *Cluster) mark(n int, gpus []int) {
	in := c.topoIn[:len(c.nodes[n].gpuCap)]
	clear(in)
	for _, g := range gpus {
		in[g] = true
	}
}

// likeGPU returns the GPU a request of one share takes among those of elig
// that the policy finds as good as best (the same free share and capacity):
// the one whose group holds the fewest fully free GPUs, so that shares stay
// off the groups multi-GPU requests need whole.
func (c *Cluster) likeGPU(n int, elig []int, best int) int {
	nd := &c.nodes[n]
	if !nd.wired() {
		return best
	}
	same := c.topoSame[:0]
	for _, g := range elig {
		if nd.gpuFree[g] == nd.gpuFree[best] && nd.gpuCap[g] == nd.gpuCap[best] {
			same = append(same, g)
		}
	}
	c.topoSame = same
	if len(same) < 2 {
		return best
	}
	in, whole := c.topoIn[:len(nd.gpuCap)], false
	for g, f := range nd.gpuFree {
		in[g] = f == nd.gpuCap[g]
		whole = whole || in[g]
	}
	if !whole {
		return best // no group is whole
	}
	return c.leastCrowded(n, same)
}

// appendNear appends to out the r.GPUs GPUs of elig that a request of whole
// GPUs, or of shares of several, takes where the policy has no preference
// among them: all from the group that fits them best (fitGroup); one whole GPU
// from the group with the fewest of elig; else the first. Only GPUs of one
// capacity are alike to the policies' scores, so nodes mixing capacities keep
// the first.
func (c *Cluster) appendNear(out []int, n int, r *Request, elig []int) []int {
	k := r.GPUs
	if k == 0 || !c.nodes[n].wired() || !oneCapacity(c, n, elig) {
		return append(out, elig[:k]...)
	}
	if l, id, ok := c.fitGroup(n, elig, k); ok {
		return c.appendGroup(out, n, elig, k, l, id)
	}
	if k == 1 {
		return append(out, c.leastCrowdedOf(n, elig))
	}
	return append(out, elig[:k]...)
}
