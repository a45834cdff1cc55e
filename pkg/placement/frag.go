package placement

import (
	"slices"
	"strings"
)

// fragModel measures a node's GPU fragmentation against a workload, as FGD
// defines it: for each shape, the free GPU share that shape could not use,
// weighted by how often the shape occurs. A shape the node cannot host at all
// (CPU short, model not allowed, too few GPUs with enough free share, or no
// GPU wanted) leaves the whole free share unusable; one it can host leaves
// unusable the GPUs whose free share is below the shape's per-GPU demand.
type fragModel struct {
	shapes []fragShape
	// byModels caches, per set of node GPU models, the shapes that can use
	// the node and the weight of those that cannot (they count all free GPU
	// share as fragment whatever the node's state).
	byModels map[uint64]*modelView
	c        *Cluster
	// memo caches frag by node state: the fragmentation of a state depends
	// only on (models, free CPU, multiset of free GPU shares), and in a
	// cluster of identical machines the same states recur across nodes and
	// decisions.
	memo map[fragKey]float64
	// fits and belows are compute's scratch, per distinct share.
	fits   []int
	belows []int64
	// cpuReach (fgpu) counts, for each GPU-sharing shape, only the GPU
	// share that as many copies of the shape as the node's free CPU allows
	// could take; FGD counts all the share one copy could reach, so a node
	// whose CPU runs out before its GPUs looks unfragmented to it.
	cpuReach bool
	// cpuSlack scales the free CPU for cpuReach (1.25: a node counts as
	// CPU-short for a shape only when 1.25 x its free CPU cannot host
	// enough copies).
	cpuSlack float64
	// reachGuard leaves cpuReach out on nodes that can still host the
	// guarded multi-GPU shapes (fgpu's Ablations.ReachGuard).
	reachGuard ReachGuard
	multi      []fragShape
	// mixTheta (fgpu's MixReach) relaxes each sharing shape's CPU reach
	// towards the mix's: the share that cpuSlack x free CPU covers at the
	// workload's mean CPU per GPU share unit (cpuPerShare, CPU-only shapes
	// included). A GPU a CPU-heavy shape cannot reach is not lost if the
	// rest of the mix can use it.
	mixTheta    float64
	cpuPerShare float64
	// perShape uses each shape's own theta instead of mixTheta (fgpu's
	// Ablations.MixSplit).
	perShape bool
}

// fragKey identifies a node state for the memo (nodes of up to 8 GPUs of
// one capacity below 32768 units).
type fragKey struct {
	models uint64
	cpu    int64
	capa   int32
	n      uint8
	free   [8]int16
}

const memoLimit = 1 << 20

type fragShape struct {
	cpu, share int64 // share 0 = whole GPUs
	gpus       int
	mask       uint64 // 0 = any model
	none       bool   // asks for models the cluster lacks
	p          float64
	theta      float64 // MixReach fraction for this shape (perShape)
}

type modelView struct {
	shapes []fragShape
	fixed  float64
	// shares are the distinct per-GPU shares of shapes (0: whole GPUs), and each shape's
	// at its index in them: shapes of one share see the same GPUs as big enough, so
	// compute counts them once per share, not once per shape.
	shares []int64
	at     []int
}

func newFragModel(c *Cluster, w Workload) *fragModel {
	fm := &fragModel{byModels: map[uint64]*modelView{}, c: c, memo: map[fragKey]float64{}}
	for _, s := range w {
		fs := fragShape{cpu: s.CPUMilli, gpus: s.GPUs, share: s.Share, p: s.Weight}
		if s.Share >= DefaultGPUCapacity {
			fs.share = 0
		}
		if s.Models != "" {
			fs.mask, _ = c.modelMask(splitModels(s.Models))
			fs.none = fs.mask == 0
		}
		fm.shapes = append(fm.shapes, fs)
	}
	return fm
}

func (fm *fragModel) view(models uint64) *modelView {
	if v, ok := fm.byModels[models]; ok {
		return v
	}
	v := &modelView{}
	for _, s := range fm.shapes {
		if s.gpus == 0 || s.none || (s.mask != 0 && s.mask&models == 0) {
			v.fixed += s.p
		} else {
			v.shapes = append(v.shapes, s)
			i := slices.Index(v.shares, s.share)
			if i < 0 {
				i = len(v.shares)
				v.shares = append(v.shares, s.share)
			}
			v.at = append(v.at, i)
		}
	}
	fm.byModels[models] = v
	return v
}

// frag is the expected unusable free GPU share of a node with models, cpu
// free CPU and the given free/capacity per GPU.
func (fm *fragModel) frag(models uint64, cpu int64, free, capa []int64) float64 {
	k, ok := makeKey(models, cpu, free, capa)
	if !ok {
		return fm.compute(models, cpu, free, capa)
	}
	if v, hit := fm.memo[k]; hit {
		return v
	}
	v := fm.compute(models, cpu, free, capa)
	if len(fm.memo) >= memoLimit {
		clear(fm.memo)
	}
	fm.memo[k] = v
	return v
}

func makeKey(models uint64, cpu int64, free, capa []int64) (fragKey, bool) {
	k := fragKey{models: models, cpu: cpu, n: uint8(len(free))}
	if len(free) > len(k.free) {
		return k, false
	}
	if len(capa) > 0 {
		k.capa = int32(capa[0])
	}
	for i, f := range free {
		if capa[i] != int64(k.capa) || capa[i] > 32767 {
			return k, false
		}
		// insertion sort: the state is a multiset of free shares
		j := i
		for ; j > 0 && k.free[j-1] > int16(f); j-- {
			k.free[j] = k.free[j-1]
		}
		k.free[j] = int16(f)
	}
	return k, true
}

func (fm *fragModel) compute(models uint64, cpu int64, free, capa []int64) float64 {
	var total int64
	for _, f := range free {
		total += f
	}
	if total == 0 {
		return 0
	}
	v := fm.view(models)
	out := v.fixed * float64(total)
	reach := fm.cpuReach
	if reach && fm.reachGuard != ReachGuardNone && fm.hostsMulti(cpu, free, capa) {
		reach = false
	}
	var mix int64
	if fm.mixTheta > 0 {
		mix = int64(max(fm.cpuSlack, 1) * float64(cpu) / fm.cpuPerShare)
	}
	// Per distinct share: the GPUs big enough for it (fits) and the free share of the others.
	fits, belows := fm.fits[:0], fm.belows[:0]
	for _, share := range v.shares {
		var below int64
		n := 0
		for g, f := range free {
			if (share == 0 && f >= capa[g]) || (share > 0 && f >= share) {
				n++
			} else {
				below += f
			}
		}
		fits, belows = append(fits, n), append(belows, below)
	}
	fm.fits, fm.belows = fits, belows
	for i := range v.shapes {
		s := &v.shapes[i]
		if cpu < s.cpu {
			out += s.p * float64(total)
			continue
		}
		n, below := fits[v.at[i]], belows[v.at[i]]
		if n >= s.gpus {
			if reach && s.share > 0 && s.cpu > 0 {
				// copies the CPU allows x their share, at most what
				// the GPUs offer
				copies := cpu / s.cpu
				if fm.cpuSlack > 0 {
					copies = int64(fm.cpuSlack * float64(cpu) / float64(s.cpu))
				}
				rs := copies * s.share * int64(s.gpus)
				if fm.mixTheta > 0 && mix > rs {
					th := fm.mixTheta
					if fm.perShape {
						th = s.theta
					}
					rs += int64(th * float64(mix-rs))
				}
				if usable := total - below; rs < usable {
					below = total - rs
				}
			}
			out += s.p * float64(below)
		} else {
			out += s.p * float64(total)
		}
	}
	return out
}

// mixCPUPerShare is the workload's mean CPU per GPU share unit over all its
// shapes (CPU-only ones included); ok is false if it asks for no GPU.
func mixCPUPerShare(w Workload) (v float64, ok bool) {
	var cpu, share float64
	for _, s := range w {
		cpu += s.Weight * float64(s.CPUMilli)
		if s.GPUs > 0 {
			sh := s.Share
			if sh <= 0 || sh > DefaultGPUCapacity {
				sh = DefaultGPUCapacity
			}
			share += s.Weight * float64(s.GPUs) * float64(sh)
		}
	}
	return cpu / share, share > 0
}

// hostsMulti reports whether a node state can host the guarded multi-GPU
// shapes (model masks ignored).
func (fm *fragModel) hostsMulti(cpu int64, free, capa []int64) bool {
	whole := 0
	for g, f := range free {
		if f == capa[g] {
			whole++
		}
	}
	for _, s := range fm.multi {
		if whole >= s.gpus && cpu >= s.cpu {
			return true
		}
	}
	return false
}

// setReachGuard picks the multi-GPU shapes whose hosts keep FGD's measure.
func (fm *fragModel) setReachGuard(mode ReachGuard) {
	fm.reachGuard = mode
	fm.multi = nil
	if mode == ReachGuardNone {
		return
	}
	var big fragShape
	for _, s := range fm.shapes {
		if s.gpus < 2 || s.share != 0 || s.none {
			continue
		}
		if mode == ReachGuardAny {
			fm.multi = append(fm.multi, s)
		} else if s.gpus > big.gpus || (s.gpus == big.gpus && s.p > big.p) {
			big = s
		}
	}
	if mode == ReachGuardLargest && big.gpus > 0 {
		fm.multi = append(fm.multi, big)
	}
}

// nodeFrag is the fragmentation of node n as it is now.
func (fm *fragModel) nodeFrag(n int) float64 {
	nd := &fm.c.nodes[n]
	return fm.frag(nd.models, nd.cpuFree, nd.gpuFree, nd.gpuCap)
}

// splitModels splits a shape's "A|B" model list, dropping empty names.
func splitModels(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == '|' })
}

// nodeFrags keeps each node's fragmentation, and their sum, current as the cluster changes:
// a change to one node recomputes that node only.
type nodeFrags struct {
	cur   []float64
	total float64
}

func (nf *nodeFrags) track(c *Cluster, fm *fragModel) {
	nf.cur = make([]float64, c.Len())
	nf.total = 0
	for n := range nf.cur {
		nf.cur[n] = fm.nodeFrag(n)
		nf.total += nf.cur[n]
	}
	c.OnChange(func(n int) {
		v := fm.nodeFrag(n)
		nf.total += v - nf.cur[n]
		nf.cur[n] = v
	})
}
