package adoption

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// Workload is one workload: the top owner of its shares' pods, as the allocator's
// recommendations name it (api.WorkloadOf), or ResourceClaim/<name> for a claim no pod uses.
type Workload struct {
	api.SizingWorkload
	// Shares counts its placed shares (a claim's GPU each) and pods fgpu did not place, GPUs
	// the distinct GPUs they are on, MemoryHeldBytes what they hold, each GPU's once (a whole
	// GPU all its memory, as does a GPU held outside fgpu, alone or time-sliced).
	Shares          int   `json:"shares"`
	GPUs            int   `json:"gpus"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// Used is what its shares used in the window; absent where none was measured.
	Used *MeasuredUse `json:"used,omitempty"`
	// Recommendation is the allocator's newest for it within the window; absent where none.
	Recommendation *api.SizingRecommendation `json:"recommendation,omitempty"`
	RecommendedAt  *time.Time                `json:"recommendedAt,omitempty"`
	// KeepsWhole: it holds whole GPUs and its recommendation says it keeps a GPU busy, so
	// they stay whole (as sizing's mode auto keeps them), and GPUsNeeded counts them so.
	KeepsWhole bool `json:"keepsWhole,omitempty"`
	// Observed: it holds its GPUs outside fgpu (NVIDIA's device plugin), as its pods ask
	// for them (the extended resource, nvidia.com/gpu) and the kubelet plugins measured
	// them; its recommendation is what fgpu would give it. TimeSliced: the device plugin
	// shares its GPUs with other pods (time-slicing, MPS); each counts once, with all its
	// memory. GPUsEstimated: some of its pods ran nothing seen, so which shared GPUs they
	// hold is not known; GPUs counts the fewest they fit on.
	Observed      bool `json:"observed,omitempty"`
	TimeSliced    bool `json:"timeSliced,omitempty"`
	GPUsEstimated bool `json:"gpusEstimated,omitempty"`
	// NoSamples counts its pods that hold GPUs outside fgpu on a node the kubelet plugin
	// observes but ran no process it saw in the window (an idle notebook).
	NoSamples int `json:"noSamples,omitempty"`

	// shareGPUs counts its shares' GPUs, a GPU once per share (a share of two GPUs, two).
	shareGPUs int
	// packed is the memory its shares are packed at without a recommendation: what each
	// holds, a time-sliced pod its slice of each GPU (Share.Size).
	packed int64
}

// MemoryNeededBytes is the memory the workload would hold at the size fgpu gives it, as the
// packing counts it: its recommended memory on each of its shares' GPUs; what its shares
// hold now (a time-sliced pod its slice of its GPU) where it keeps its GPUs whole or has no
// recommendation.
func (w *Workload) MemoryNeededBytes() int64 {
	if w.Recommendation == nil || w.KeepsWhole {
		return w.packed
	}
	return w.Recommendation.MemoryBytes * int64(w.shareGPUs)
}

// MeasuredUse sums the newest usage report of each share measured in the window.
type MeasuredUse struct {
	// Shares counts the shares measured, MemoryHeldBytes what they hold: the memory figures
	// are theirs, against it.
	Shares          int   `json:"shares"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// MemoryP95Bytes sums each share's 95th percentile, MemoryPeakBytes each share's peak
	// (an upper bound: the peaks need not coincide).
	MemoryP95Bytes  int64 `json:"memoryP95Bytes"`
	MemoryPeakBytes int64 `json:"memoryPeakBytes"`
	// SMP95Percent is the highest share's 95th percentile of SM activity, SMMeanPercent the
	// mean over every share's samples; both absent where the driver gave no SM samples.
	SMP95Percent  *int      `json:"smP95Percent,omitempty"`
	SMMeanPercent *int      `json:"smMeanPercent,omitempty"`
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
}

// Summary is the before and after of a set of shares.
type Summary struct {
	Workloads []Workload `json:"workloads"`
	// GPUsHeld counts the GPUs the workloads hold now, a GPU they share once;
	// MemoryHeldBytes is the memory they hold of them (all of a GPU held outside fgpu).
	// GPUsHeldAtMost is the most they may hold, where it is more: pods whose device plugin
	// time-slices GPUs and which ran nothing seen are counted on the fewest GPUs they fit.
	GPUsHeld        int   `json:"gpusHeld"`
	GPUsHeldAtMost  *int  `json:"gpusHeldAtMost,omitempty"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// GPUsNeeded is how many of the cluster's GPUs the same workloads would take at the sizes
	// fgpu gives them: each share at its workload's recommended memory, at what it holds now
	// where its workload has no recommendation, a whole GPU where it holds one and its
	// workload KeepsWhole; a GPU held outside fgpu on a node fgpu does not publish stays as it
	// is. Absent where no workload has a recommendation in the window, as nothing would change.
	GPUsNeeded *int `json:"gpusNeeded,omitempty"`
	// UnplacedShares counts the shares the packing found no room for: GPUsNeeded leaves them out.
	UnplacedShares       int `json:"unplacedShares,omitempty"`
	MeasuredWorkloads    int `json:"measuredWorkloads"`
	RecommendedWorkloads int `json:"recommendedWorkloads"`
	// Namespaces sums the workloads per namespace.
	Namespaces map[string]*Namespace `json:"-"`
}

// Namespace sums a namespace's workloads.
type Namespace struct {
	// Workloads counts them; MeasuredWorkloads those with use measured in the window,
	// RecommendedWorkloads those with a recommendation.
	Workloads, MeasuredWorkloads, RecommendedWorkloads int
	// GPUsHeld counts the distinct GPUs its shares are on, ObservedGPUsHeld those of them its
	// pods fgpu did not place are on.
	GPUsHeld, ObservedGPUsHeld int
	// MemoryHeldBytes is what its shares hold, each GPU's once, MemoryNeededBytes what they
	// would hold at fgpu's sizes (Workload.MemoryNeededBytes).
	MemoryHeldBytes, MemoryNeededBytes int64
	// MeasuredMemoryHeldBytes is what its shares measured in the window hold, each GPU's
	// once, MemoryP95Bytes the sum of their 95th percentiles.
	MeasuredMemoryHeldBytes, MemoryP95Bytes int64
}

// Recommend is a workload's newest recommendation within the window and when it was told;
// ok false where there is none.
type Recommend func(api.SizingWorkload) (rec api.SizingRecommendation, at time.Time, ok bool)

// Summarize sums the shares of fgpu's claims (placed, PlacedShares) and of the pods fgpu did
// not place (outside, ObservedShares) per workload and namespace, gives each workload its
// recommendation, and, where any workload has one, packs the shares at their workloads'
// sizes onto empty copies of gpus (every published GPU, in name order).
func Summarize(gpus []*GPU, placed []Share, outside Observed, recommend Recommend) (*Summary, error) {
	s := &Summary{Workloads: []Workload{}, Namespaces: map[string]*Namespace{}}
	shares := slices.Concat(placed, outside.Shares)
	s.tally(shares, recommend)
	if outside.Slack > 0 {
		most := s.GPUsHeld + outside.Slack
		s.GPUsHeldAtMost = &most
	}
	if s.RecommendedWorkloads > 0 {
		needed, unplaced, err := s.pack(gpus, shares)
		if err != nil {
			return nil, err
		}
		s.GPUsNeeded, s.UnplacedShares = &needed, unplaced
	}
	return s, nil
}

// workloadSums is a workload's shares as tally sums them.
type workloadSums struct {
	Workload
	gpus     map[*GPU]bool
	whole    bool // every share of it holds whole GPUs
	use      *api.ShareUsage
	all      []*Share
	measured []*Share
}

// add counts a share of the workload.
func (w *workloadSums) add(sh *Share) {
	w.Shares++
	w.all = append(w.all, sh)
	w.shareGPUs += len(sh.GPUs)
	w.packed += packedAt(sh)
	w.whole = w.whole && sh.Whole
	w.Observed = w.Observed || sh.Observed
	w.TimeSliced = w.TimeSliced || sh.TimeSliced
	w.GPUsEstimated = w.GPUsEstimated || sh.Estimated
	if sh.NoSamples {
		w.NoSamples++
	}
	for _, g := range sh.GPUs {
		w.gpus[g] = true
	}
	if sh.Use != nil {
		if w.Used == nil {
			w.Used = &MeasuredUse{}
		}
		w.Used.Shares++
		w.measured = append(w.measured, sh)
		w.use = merged(w.use, sh.Use)
	}
}

// namespaceSums is a namespace's shares as tally sums them.
type namespaceSums struct {
	all, observed map[*GPU]bool
	shares        []*Share
	measured      []*Share
}

// tally sums the shares per workload, namespace and into the totals, and gives each
// workload its recommendation.
func (s *Summary) tally(shares []Share, recommend Recommend) {
	byWorkload := map[api.SizingWorkload]*workloadSums{}
	byNamespace := map[string]*namespaceSums{}
	held := map[*GPU]bool{}
	all := make([]*Share, 0, len(shares))
	for i := range shares {
		sh := &shares[i]
		all = append(all, sh)
		w := byWorkload[sh.Workload]
		if w == nil {
			w = &workloadSums{Workload: Workload{SizingWorkload: sh.Workload}, gpus: map[*GPU]bool{}, whole: true}
			byWorkload[sh.Workload] = w
		}
		w.add(sh)
		ns := byNamespace[sh.Workload.Namespace]
		if ns == nil {
			ns = &namespaceSums{all: map[*GPU]bool{}, observed: map[*GPU]bool{}}
			byNamespace[sh.Workload.Namespace] = ns
		}
		ns.shares = append(ns.shares, sh)
		if sh.Use != nil {
			ns.measured = append(ns.measured, sh)
		}
		for _, g := range sh.GPUs {
			held[g], ns.all[g] = true, true
			if sh.Observed {
				ns.observed[g] = true
			}
		}
	}
	s.GPUsHeld = len(held)
	s.MemoryHeldBytes = memoryHeld(all)
	for name, ns := range byNamespace {
		s.Namespaces[name] = &Namespace{GPUsHeld: len(ns.all), ObservedGPUsHeld: len(ns.observed),
			MemoryHeldBytes: memoryHeld(ns.shares), MeasuredMemoryHeldBytes: memoryHeld(ns.measured)}
	}
	for key, w := range byWorkload {
		s.finish(w, recommend)
		ns := s.Namespaces[key.Namespace]
		ns.Workloads++
		if w.Recommendation != nil {
			ns.RecommendedWorkloads++
		}
		ns.MemoryNeededBytes += w.MemoryNeededBytes()
		if w.Used != nil {
			ns.MeasuredWorkloads++
			ns.MemoryP95Bytes += w.Used.MemoryP95Bytes
		}
		s.Workloads = append(s.Workloads, w.Workload)
	}
	sort.Slice(s.Workloads, func(i, j int) bool {
		return s.Workloads[i].String() < s.Workloads[j].String()
	})
}

// finish gives a workload its GPUs, memory, recommendation and use, and counts it.
func (s *Summary) finish(w *workloadSums, recommend Recommend) {
	w.GPUs = len(w.gpus)
	w.MemoryHeldBytes = memoryHeld(w.all)
	if rec, at, ok := recommend(w.SizingWorkload); ok {
		w.Recommendation, w.RecommendedAt = &rec, &at
		w.KeepsWhole = w.whole && rec.ComputePercent >= engine.BusyComputePercent
		s.RecommendedWorkloads++
	}
	if u := w.use; u != nil {
		s.MeasuredWorkloads++
		w.Used.MemoryHeldBytes = memoryHeld(w.measured)
		w.Used.MemoryP95Bytes, w.Used.MemoryPeakBytes, w.Used.From, w.Used.To = u.MemoryP95Bytes, u.MemoryMaxBytes, u.From, u.To
		if u.SMSamples > 0 {
			w.Used.SMP95Percent, w.Used.SMMeanPercent = &u.SMP95Percent, &u.SMMeanPercent
		}
	}
}

// memoryHeld is the memory shares hold, each GPU's once: what a claim's share holds of it,
// all of it where a pod fgpu did not place holds it (alone or time-sliced with others), and
// never more than the GPU has.
func memoryHeld(shares []*Share) int64 {
	per := map[*GPU]int64{}
	for _, sh := range shares {
		for _, g := range sh.GPUs {
			if sh.Observed {
				per[g] = g.Memory
			} else {
				per[g] += sh.Held / int64(len(sh.GPUs))
			}
		}
	}
	var sum int64
	for g, m := range per {
		sum += min(m, g.Memory)
	}
	return sum
}

// packedAt is the memory a share is packed at where its workload has no recommendation:
// what it holds, or, time-sliced, its slice of each of its GPUs.
func packedAt(sh *Share) int64 {
	if sh.TimeSliced {
		return sh.Size * int64(len(sh.GPUs))
	}
	return sh.Held
}

// pack places every share at its workload's size on empty copies of the cluster's GPUs with
// the allocator's placement core, as it places best-effort claims (placement.Pack: the
// fullest GPU that still fits, on a GPU of the model the share is on now), largest first; it
// returns the GPUs taken and the shares that found no room. Shares on nodes fgpu does not
// publish (Fixed) are not packed: the GPUs they hold count as they are.
func (s *Summary) pack(gpus []*GPU, shares []Share) (needed, unplaced int, err error) {
	var specs []placement.NodeSpec
	for i, g := range gpus { // in name order, so a node's GPUs come together
		if i == 0 || g.Node != gpus[i-1].Node {
			specs = append(specs, placement.NodeSpec{Name: g.Node})
		}
		n := &specs[len(specs)-1]
		// The core counts in share units: here MiB, so that GPUs of any size pack exactly.
		n.GPUs = append(n.GPUs, placement.GPUSpec{Model: g.Product, Capacity: max(g.Memory>>20, 1)})
	}
	cluster, err := placement.NewCluster(specs)
	if err != nil {
		return 0, 0, fmt.Errorf("the cluster's GPUs for packing: %w", err)
	}
	workloads := map[api.SizingWorkload]*Workload{}
	for i := range s.Workloads {
		workloads[s.Workloads[i].SizingWorkload] = &s.Workloads[i]
	}
	reqs := make([]*placement.Request, 0, len(shares))
	fixed := map[*GPU]bool{}
	for _, sh := range shares {
		if sh.Fixed {
			// On a node fgpu does not publish: no GPU to pack it on, it keeps what it holds.
			for _, g := range sh.GPUs {
				fixed[g] = true
			}
			continue
		}
		req := &placement.Request{Name: sh.Workload.String(), GPUs: len(sh.GPUs)}
		if p := sh.GPUs[0].Product; p != "" {
			req.Models = []string{p}
		}
		switch w := workloads[sh.Workload]; {
		case sh.Whole && (w.KeepsWhole || w.Recommendation == nil):
			// Share 0 asks for whole GPUs.
		case w.Recommendation != nil:
			req.Share = mebibytes(w.Recommendation.MemoryBytes)
		default:
			req.Share = mebibytes(sh.Size)
		}
		reqs = append(reqs, req)
	}
	// Largest first: small shares then fill the room the large ones leave.
	amount := func(req *placement.Request) int64 {
		if req.Whole() {
			return math.MaxInt64
		}
		return req.Share
	}
	sort.SliceStable(reqs, func(i, j int) bool {
		if reqs[i].GPUs != reqs[j].GPUs {
			return reqs[i].GPUs > reqs[j].GPUs
		}
		return amount(reqs[i]) > amount(reqs[j])
	})
	sched := placement.NewScheduler(cluster, placement.Pack{}, 0)
	for _, req := range reqs {
		if _, err := sched.Allocate(req); err != nil {
			unplaced++
		}
	}
	needed = len(fixed)
	for n := range cluster.Len() {
		free, capacity := cluster.GPUs(n)
		for g := range free {
			if free[g] < capacity[g] {
				needed++
			}
		}
	}
	return needed, unplaced, nil
}

func mebibytes(b int64) int64 { return max((b+(1<<20)-1)>>20, 1) }
