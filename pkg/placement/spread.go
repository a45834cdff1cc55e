package placement

// Spread puts a request on the least-loaded GPUs: inside a node the GPUs
// with the most free share, and among nodes the one whose chosen GPUs keep
// the largest fraction of their capacity free. The allocator uses it for
// latency-critical claims, which should share a GPU with as little as
// possible.
type Spread struct{}

func (Spread) Name() string    { return "spread" }
func (Spread) Attach(*Cluster) {}

// scoresByState implements stateScorer.
func (Spread) scoresByState() bool { return true }
func (Spread) Score(c *Cluster, n int, r *Request, elig, out []int) (float64, []int) {
	return pick(c, n, r, elig, out, true)
}

// Pack puts a request on the fullest GPUs that still fit it: inside a node
// the GPUs with the least free share, and among nodes the one whose chosen
// GPUs keep the smallest fraction free. The allocator uses it for
// best-effort claims, which leave whole GPUs to the others.
type Pack struct{}

func (Pack) Name() string    { return "pack" }
func (Pack) Attach(*Cluster) {}

// scoresByState implements stateScorer.
func (Pack) scoresByState() bool { return true }
func (Pack) Score(c *Cluster, n int, r *Request, elig, out []int) (float64, []int) {
	return pick(c, n, r, elig, out, false)
}

// pick chooses r.GPUs of the eligible GPUs, most free first (most) or least free first, and scores the node by the
// fraction of the chosen GPUs' capacity left free after the placement,
// negated for pack. On a wired node, several GPUs come from the group that fits
// them best, one whole GPU from the group with the fewest usable ones, and a
// share from the group with the fewest whole free GPUs among the GPUs it finds
// as good (topology.go).
func pick(c *Cluster, n int, r *Request, elig, out []int, most bool) (float64, []int) {
	free, capa := c.GPUs(n)
	k := max(r.GPUs, 1)
	var chosen []int
	if l, id, ok := c.fitGroup(n, elig, k); ok && oneCapacity(c, n, elig) {
		chosen = c.appendGroup(nil, n, elig, len(elig), l, id) // all of one group: the best fit
	} else {
		chosen = append([]int(nil), elig...)
	}
	// Selection sort of the first r.GPUs: elig is at most a node's GPUs.
	for i := 0; i < k && i < len(chosen); i++ {
		b := i
		for j := i + 1; j < len(chosen); j++ {
			if (most && free[chosen[j]] > free[chosen[b]]) || (!most && free[chosen[j]] < free[chosen[b]]) {
				b = j
			}
		}
		chosen[i], chosen[b] = chosen[b], chosen[i]
	}
	chosen = chosen[:min(k, len(chosen))]
	switch {
	case k > 1 || len(chosen) == 0:
	case r.Whole() || r.Share >= capa[chosen[0]]:
		if oneCapacity(c, n, elig) {
			chosen[0] = c.leastCrowdedOf(n, elig)
		}
	default:
		chosen[0] = c.likeGPU(n, elig, chosen[0])
	}
	var left, total float64
	for _, g := range chosen {
		take := r.Share
		if r.Whole() || take >= capa[g] {
			take = capa[g]
		}
		left += float64(free[g] - take)
		total += float64(capa[g])
	}
	score := 0.0
	if total > 0 {
		score = left / total
	}
	if !most {
		score = -score
	}
	return score, append(out, chosen...)
}

// subsetBound implements stateScorer: among GPUs of one capacity, the most free (spread)
// or least free (pack) of all usable ones leave at least as good a fraction as those of
// any subset. Shares of several GPUs on a wired node come from the group that fits them
// best, and a subset may leave a group whose GPUs score better.
func (Spread) subsetBound(c *Cluster, n int, r *Request, elig []int) bool {
	return pickBound(c, n, r, elig)
}

// subsetBound implements stateScorer, as Spread's does.
func (Pack) subsetBound(c *Cluster, n int, r *Request, elig []int) bool {
	return pickBound(c, n, r, elig)
}

// pickBound is Spread's and Pack's subsetBound.
func pickBound(c *Cluster, n int, r *Request, elig []int) bool {
	if !oneCapacity(c, n, elig) {
		return false
	}
	return r.GPUs < 2 || !c.nodes[n].wired() || r.Whole() || r.Share >= c.nodes[n].gpuCap[elig[0]]
}
