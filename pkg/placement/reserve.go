package placement

// reserve tracks, for each multi-GPU whole-GPU shape of the workload, how
// many nodes could still host it (enough fully free GPUs of an allowed
// model and enough free CPU), against the pods of that shape expected while
// the cluster's free GPU share fills (the shape's frequency x free share /
// the workload's mean GPU share per pod). fgpu's Reserve and ReserveRatio
// ablations use it to penalise placements that stop a node hosting such a
// shape. A change to a node refreshes that node's hosting set only.
type reserve struct {
	c      *Cluster
	shapes []resShape
	host   []uint64 // per node: the shapes it can host now
	count  []int    // per shape: nodes that can host it
	perPod float64  // the workload's mean GPU share per pod
	alpha  float64
	// need and scarce are computed lazily once per cluster change.
	ver, at uint64
	need    []float64
	scarce  uint64
}

type resShape struct {
	gpus int
	cpu  int64
	mask uint64 // 0 = any model
	p    float64
}

// newReserve tracks the multi-GPU shapes of w on c (the 64 most frequent
// if there are more). A shape is scarce when the nodes that can host it
// number at most alpha x the pods of it expected.
func newReserve(c *Cluster, w Workload, alpha float64) *reserve {
	r := &reserve{c: c, alpha: alpha}
	for _, s := range w {
		share := s.Share
		if share <= 0 || share > DefaultGPUCapacity {
			share = DefaultGPUCapacity
		}
		r.perPod += s.Weight * float64(s.GPUs) * float64(share)
		if s.GPUs < 2 || share < DefaultGPUCapacity {
			continue
		}
		rs := resShape{gpus: s.GPUs, cpu: s.CPUMilli, p: s.Weight}
		if s.Models != "" {
			m, ok := c.modelMask(splitModels(s.Models))
			if !ok {
				continue // no node can ever host it
			}
			rs.mask = m
		}
		merged := false
		for i := range r.shapes {
			if q := &r.shapes[i]; q.gpus == rs.gpus && q.cpu == rs.cpu && q.mask == rs.mask {
				q.p += rs.p
				merged = true
				break
			}
		}
		if !merged {
			r.shapes = append(r.shapes, rs)
		}
	}
	if len(r.shapes) > 64 {
		for i := 1; i < len(r.shapes); i++ {
			for j := i; j > 0 && r.shapes[j].p > r.shapes[j-1].p; j-- {
				r.shapes[j], r.shapes[j-1] = r.shapes[j-1], r.shapes[j]
			}
		}
		r.shapes = r.shapes[:64]
	}
	r.count = make([]int, len(r.shapes))
	r.need = make([]float64, len(r.shapes))
	r.host = make([]uint64, c.Len())
	for n := range r.host {
		nd := &c.nodes[n]
		r.host[n] = r.hosts(nd, nd.cpuFree, nd.gpuFree)
		r.add(r.host[n], 1)
	}
	r.at = ^uint64(0)
	c.OnChange(func(n int) {
		nd := &c.nodes[n]
		if h := r.hosts(nd, nd.cpuFree, nd.gpuFree); h != r.host[n] {
			r.add(r.host[n], -1)
			r.add(h, 1)
			r.host[n] = h
		}
		r.ver++
	})
	return r
}

func (r *reserve) add(m uint64, d int) {
	for i := 0; m != 0; i, m = i+1, m>>1 {
		if m&1 != 0 {
			r.count[i] += d
		}
	}
}

// hosts is the set of shapes a node nd left with cpu free CPU and the free
// GPU shares free could host.
func (r *reserve) hosts(nd *node, cpu int64, free []int64) uint64 {
	var out uint64
	whole := -1
	for i := range r.shapes {
		s := &r.shapes[i]
		if cpu < s.cpu || len(free) < s.gpus || (s.mask != 0 && s.mask&nd.models == 0) {
			continue
		}
		k := 0
		if s.mask == 0 || popcount(nd.models) == 1 {
			if whole < 0 {
				whole = 0
				for g, f := range free {
					if f == nd.gpuCap[g] {
						whole++
					}
				}
			}
			k = whole
		} else {
			for g, f := range free {
				if f == nd.gpuCap[g] && s.mask&(1<<nd.gpuModel[g]) != 0 {
					k++
				}
			}
		}
		if k >= s.gpus {
			out |= 1 << i
		}
	}
	return out
}

// refresh recomputes the expected pods per shape and the scarce set if the
// cluster changed since the last call.
func (r *reserve) refresh() {
	if r.at == r.ver {
		return
	}
	r.at = r.ver
	r.scarce = 0
	pods := float64(r.c.gpuFree) / max(r.perPod, 1)
	for i := range r.shapes {
		r.need[i] = r.shapes[i].p * pods
		if float64(r.count[i]) <= r.alpha*r.need[i] {
			r.scarce |= 1 << i
		}
	}
}

// broken is how many scarce shapes node nd stops hosting when left with cpu
// free CPU and free GPU shares free.
func (r *reserve) broken(nd *node, cpu int64, free []int64) int {
	r.refresh()
	sc := r.scarce & r.host[nd.idx]
	if sc == 0 {
		return 0
	}
	return popcount(sc &^ r.hosts(nd, cpu, free))
}

// lostNeed sums, over the shapes node nd stops hosting when left with cpu
// free CPU and free GPU shares free, the pods of the shape expected per node
// that can host it now (at most 1 per shape).
func (r *reserve) lostNeed(nd *node, cpu int64, free []int64) float64 {
	h := r.host[nd.idx]
	if h == 0 {
		return 0
	}
	r.refresh()
	var out float64
	lost := h &^ r.hosts(nd, cpu, free)
	for i := 0; lost != 0; i, lost = i+1, lost>>1 {
		if lost&1 != 0 {
			out += min(1, r.need[i]/float64(max(r.count[i], 1)))
		}
	}
	return out
}
