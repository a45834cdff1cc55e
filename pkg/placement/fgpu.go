package placement

// FGPU is fgpu's default policy. It ranks a request's candidate GPUs and
// nodes by the LP packing loss first (what the placement costs the node's
// free shares against the best packing of the workload's mix, lploss.go),
// then by FGD's fragmentation gradient over the workload's full shape
// distribution on FGD's coarse 0..100 scale, then by node name. Per-node
// fragmentation is cached and refreshed only for the node that changed, and
// node states are memoised. On top of FGD it counts CPU: a sharing shape only
// reaches the GPU share its copies' CPU allows (CPU reach, with
// Options.CPUSlack), relaxed towards what the workload's mix could reach when
// the workload is GPU-bound (Options.MixReach). Inside the node it places by the
// node's wiring (topology.go): several GPUs from one NVLink island, PCIe root or
// NUMA node, a share off the groups still whole. For whole GPUs and a share of
// one it chooses among GPUs the score finds alike, so the node's score, and the
// node chosen, do not change. The batch planner
// (Scheduler.AllocateBatch) uses TotalFrag to compare plans.
//
// NewFGPU builds the shipped policy; NewAblatedFGPU builds the variants
// docs/placement.md measures (ablation.go).
type FGPU struct {
	w  Workload
	o  Options
	ab Ablations
	// ablated is ab != Ablations{}: the shipped policy skips ablatedFinal.
	ablated bool
	fm      *fragModel
	nodeFrags
	tmp     []int64
	lp      *lpLoss
	nodeVal []float64 // each node's value for the node loss, kept current
	whole   bool      // the request being scored takes whole GPUs
	scale   float64   // the request's sigmoid scale (Ablations.Scale, ScaleFrac)
	lastDec float64   // the last scored node's exact decrease (Ablations.TieType)
	group   []int     // each node's type (Ablations.TieType)
	rank    []float64 // each node's fixed tie rank (Ablations.TieOrder)
	res     *reserve  // Ablations.Reserve, ReserveRatio
}

// Options are the settings of fgpu's shipped policy. DefaultOptions is what
// the allocator and fgpu sim run; docs/placement.md ("Knobs") has what each
// setting is worth.
type Options struct {
	// CPUSlack scales the free CPU that CPU reach counts: a node is short of
	// CPU for a sharing shape only when CPUSlack x its free CPU cannot host
	// enough copies of it (0 = 1).
	CPUSlack float64
	// MixReach, when positive and the workload asks for less CPU per GPU
	// share than the cluster has, moves each sharing shape's CPU reach this
	// fraction of the way towards the mix's reach (CPUSlack x free CPU / the
	// workload's mean CPU per GPU share, CPU-only shapes included) when that
	// is larger: a GPU a CPU-heavy shape cannot reach is not lost if the rest
	// of the mix can use it.
	MixReach float64
	// PackPrice takes this many score points per GPU of LP packing loss (0:
	// no loss, FGD alone). The loss is rounded to 1/1000 GPU, so at 1e6 it
	// decides before FGD's whole 0..100 scale. GPUs whose capacity is not
	// 1000 units get no loss.
	PackPrice float64
}

// DefaultOptions are the shipped policy's settings.
func DefaultOptions() Options {
	return Options{CPUSlack: 1.25, MixReach: 0.5, PackPrice: 1e6}
}

// NewFGPU returns fgpu's policy for workload w with options o.
func NewFGPU(w Workload, o Options) *FGPU { return NewAblatedFGPU(w, o, Ablations{}) }

// NewAblatedFGPU returns fgpu's policy with the variants in a turned on (for
// the simulator: fgpu sim --knobs).
func NewAblatedFGPU(w Workload, o Options, a Ablations) *FGPU {
	return &FGPU{w: w, o: o, ab: a, ablated: a != Ablations{}}
}

// TotalFrag implements Fragmenter: the cluster's expected fragmentation.
func (f *FGPU) TotalFrag() float64 { return f.total }

// RandomTies implements RandomTies.
func (f *FGPU) RandomTies() bool { return f.ab.Random }

func (*FGPU) Name() string { return "fgpu" }

// scoresByState implements stateScorer: the shipped policy's per-node caches are
// functions of the node's state; some ablations rank nodes by identity.
func (f *FGPU) scoresByState() bool { return !f.ablated }

func (f *FGPU) Attach(c *Cluster) {
	w := f.ab.workload(f.w)
	f.fm = newFragModel(c, w)
	f.fm.cpuReach = !f.ab.NoCPUReach
	f.fm.cpuSlack = f.o.CPUSlack
	f.fm.setReachGuard(f.ab.ReachGuard)
	theta := f.ab.mixTheta(f.o.MixReach)
	if k, ok := mixCPUPerShare(w); theta > 0 && ok && k < clusterCPUPerShare(c) {
		f.fm.mixTheta, f.fm.cpuPerShare = theta, k
		f.ab.splitMix(f.fm)
	}
	f.track(c, f.fm)
	f.lp = nil
	if f.o.PackPrice > 0 {
		f.lp = newLPLoss(w, !f.ab.NoPackCPU)
		if !f.ab.NoPackNode {
			var maxCPU, maxMem int64
			for i := range c.nodes {
				maxCPU = max(maxCPU, c.nodes[i].cpuCap)
				maxMem = max(maxMem, c.nodes[i].memCap)
			}
			f.lp.withNodeValues(w, maxCPU, maxMem)
			f.nodeVal = make([]float64, c.Len())
			value := func(n int) {
				nd := &c.nodes[n]
				f.nodeVal[n] = f.lp.nodeValue(nd.gpuFree, nd.gpuCap, nd.cpuFree, nd.memFree)
			}
			for n := range f.nodeVal {
				value(n)
			}
			c.OnChange(value)
		}
	}
	f.attachAblations(c)
}

func (f *FGPU) Score(c *Cluster, n int, r *Request, elig, out []int) (float64, []int) {
	nd := &c.nodes[n]
	cpu := nd.cpuFree - r.CPUMilli
	f.tmp = append(f.tmp[:0], nd.gpuFree...)
	f.whole = r.Whole() || (r.GPUs > 0 && r.Share >= nd.gpuCap[elig[0]])
	f.scale = f.ab.sigmoidScale(r, f.whole)
	if r.GPUs == 1 && !r.Whole() && r.Share < nd.gpuCap[elig[0]] {
		best, bestG, bestPts := 0.0, -1, 0.0
		for i, g := range elig {
			if seenFree(nd.gpuFree, elig[:i], nd.gpuFree[g]) {
				continue
			}
			f.tmp[g] -= r.Share
			s := f.cur[n] - f.fm.frag(nd.models, cpu, f.tmp, nd.gpuCap)
			f.tmp[g] += r.Share
			pts := 0.0
			if f.lp != nil {
				var l float64
				switch {
				case f.ab.NoPackNode:
					l = f.lp.loss(nd.gpuFree[g], r.Share, nd.gpuCap[g], nd.cpuFree, cpu)
				case nd.gpuCap[g] == DefaultGPUCapacity:
					f.tmp[g] -= r.Share
					l = f.lp.nodeLoss(f.nodeVal[n], f.tmp, nd.gpuCap, cpu, nd.memFree-r.MemoryMiB, f.lp.priceOf(r.Share))
					f.tmp[g] += r.Share
				}
				pts = f.final(nd, s, cpu) - f.o.PackPrice*l
			}
			// Equal fragmentation: take the tighter GPU.
			if bestG < 0 || pts > bestPts+1e-9 || (pts > bestPts-1e-9 && (s > best+1e-9 || (s > best-1e-9 && nd.gpuFree[g] < nd.gpuFree[bestG]))) {
				best, bestG, bestPts = s, g, pts
			}
		}
		bestG = c.likeGPU(n, elig, bestG) // as good a GPU, placed by the node's wiring
		f.tmp[bestG] -= r.Share
		f.lastDec = best
		if f.lp == nil {
			bestPts = f.final(nd, best, cpu)
		}
		return f.adjust(nd, bestPts, cpu), append(out, bestG)
	}
	start := len(out)
	out = c.appendNear(out, n, r, elig)
	var price float64 // whole GPUs the LP counts, one each
	for _, g := range out[start:] {
		f.tmp[g] -= c.take(n, g, r)
		if nd.gpuCap[g] == DefaultGPUCapacity {
			price++
		}
	}
	f.lastDec = f.cur[n] - f.fm.frag(nd.models, cpu, f.tmp, nd.gpuCap)
	pts := f.final(nd, f.lastDec, cpu)
	if f.lp != nil && !f.ab.NoPackNode {
		pts -= f.o.PackPrice * f.lp.nodeLoss(f.nodeVal[n], f.tmp, nd.gpuCap, cpu, nd.memFree-r.MemoryMiB, price)
	}
	return f.adjust(nd, pts, cpu), out
}

// final is a fragmentation decrease's score: FGD's coarse 0..100 scale, on
// which many nodes tie and the node name decides.
func (f *FGPU) final(nd *node, decrease float64, cpuAfter int64) float64 {
	if f.ablated {
		return f.ablatedFinal(nd, decrease, cpuAfter)
	}
	return artifactScore(decrease)
}

// clusterCPUPerShare is the cluster's CPU per GPU share unit.
func clusterCPUPerShare(c *Cluster) float64 {
	var cpu int64
	for i := range c.nodes {
		cpu += c.nodes[i].cpuCap
	}
	return float64(cpu) / float64(max(c.gpuCap, 1))
}

// subsetBound implements stateScorer, as FGD's does; a share of one GPU scores the best of
// its GPUs' points only where the packing loss's steps are wider than FGD's whole 0..100
// scale (PackPrice of 101 or more per 1/1000 GPU; 1,000 as shipped): then no two GPUs'
// points are within the 1e-9 at which the finer ranking picks among them.
func (f *FGPU) subsetBound(c *Cluster, n int, r *Request, elig []int) bool {
	if !oneCapacity(c, n, elig) {
		return false
	}
	if r.Whole() || r.Share >= c.nodes[n].gpuCap[elig[0]] {
		return true
	}
	return r.GPUs == 1 && f.lp != nil && f.o.PackPrice >= 101*1000
}
