package sim

import (
	"errors"
	"fmt"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Class groups pods for reporting failed GPU demand.
type Class int

const (
	CPUOnly Class = iota
	Fractional
	OneGPU
	MultiGPU
	numClasses
)

var classNames = [...]string{"cpu_only", "fractional", "one_gpu", "multi_gpu"}

func (c Class) String() string { return classNames[c] }

// ClassOf classifies a request.
func ClassOf(r *placement.Request) Class {
	switch {
	case r.GPUs == 0:
		return CPUOnly
	case r.GPUs == 1 && !r.Whole():
		return Fractional
	case r.GPUs == 1:
		return OneGPU
	}
	return MultiGPU
}

// Config is one replay.
type Config struct {
	Nodes  []placement.NodeSpec
	Pods   []placement.Request
	Policy string
	Seed   int64
	Tune   float64 // arrived GPU demand / cluster GPU capacity at the end
	Batch  int     // pods decided together (Scheduler.AllocateBatch); 1 = online
	Step   float64 // curve resolution in fractions of capacity (0.1)
	// Parallel bounds the seeds replayed at once (0 = GOMAXPROCS); 1 gives
	// decision latencies free of contention between seeds.
	Parallel int
	// Shapes is the workload distribution given to the policy; nil derives
	// it from Pods with placement.TypicalShapes.
	Shapes placement.Workload
	// Learn, when set, gives the policy the workload learned from the pods
	// arrived so far instead (placement.Learner, from placement.DefaultWorkload),
	// as the allocator learns it from the claims it decides. Online only
	// (Batch 1).
	Learn *placement.LearnOptions
	// NewPolicy, when set, builds the policy instead of placement.New (for
	// ablations and tests).
	NewPolicy func(placement.Workload) placement.Policy
	// Orders is how many orders Scheduler.AllocateBatch tries per batch
	// (0 = placement.BatchOrders; 1 = arrival order only).
	Orders int
	// Inspect, when set, is called with the final cluster state (for
	// diagnostics: where the unallocated GPU share is left).
	Inspect func(seed int64, c *placement.Cluster)
	// TopologyBlind withholds the nodes' wiring from the policy: it places on
	// specs that name none, as before the policies read it (the baseline).
	// Locality is measured against the openb model (topology.go) either way.
	TopologyBlind bool
}

// Point is the GPU allocation ratio once arrived demand reached Arrived
// (both fractions of cluster GPU capacity).
type Point struct {
	Arrived, Alloc float64
}

// Result is one replay's outcome.
type Result struct {
	Seed        int64
	Curve       []Point
	Final       Point
	Placed      int
	Failed      [numClasses]int
	FailedMilli [numClasses]int64
	Reasons     map[string]int
	Decisions   []time.Duration // one per pod
	// Fill is the allocation ratio when each pod was decided, and Scored the
	// nodes the policy scored for it (online only).
	Fill   []float64
	Scored []int32
	// Rebuilds is how many times the policy was rebuilt for a learned workload
	// (Config.Learn).
	Rebuilds int
	Waste    Waste
	Locality Locality
}

// Waste splits the GPU share left unallocated at the end of a replay and
// bounds what a better placement of the same pods could recover.
type Waste struct {
	WholeGPUs   float64 // GPUs left entirely free
	PartialGPUs float64 // free share on partly used GPUs, in GPUs
	// SharedGPUs is how many GPUs hold fractional pods; RepackGPUs is
	// binpack.MinGPUs of those pods (-1 when their GPUs differ in capacity).
	SharedGPUs, RepackGPUs int
	// RepackAlloc bounds the final allocation ratio of any placement that
	// admits the same fractional pods: theirs packed onto RepackGPUs GPUs,
	// the GPUs so freed given to the demand that failed (0 when RepackGPUs
	// is -1).
	RepackAlloc float64
}

// AllocAt returns the allocation ratio on the curve at arrived fraction x
// (the last point at or before it; the final state past the end).
func (r *Result) AllocAt(x float64) float64 {
	if x >= r.Final.Arrived-1e-9 {
		return r.Final.Alloc
	}
	v := 0.0
	for _, p := range r.Curve {
		if p.Arrived <= x+1e-9 {
			v = p.Alloc
		}
	}
	return v
}

// Run replays one seed.
func Run(cfg Config) (*Result, error) {
	if cfg.Tune <= 0 {
		return nil, errors.New("tune must be positive")
	}
	if cfg.Batch < 1 {
		cfg.Batch = 1
	}
	if cfg.Step <= 0 {
		cfg.Step = 0.1
	}
	c, err := placement.NewCluster(wire(cfg.Nodes, cfg.TopologyBlind))
	if err != nil {
		return nil, err
	}
	if c.GPUCapacity() == 0 {
		return nil, errors.New("cluster has no GPUs")
	}
	shapes := cfg.Shapes
	var learn *placement.Learner
	switch {
	case cfg.Learn != nil:
		if cfg.Batch > 1 {
			return nil, errors.New("a learned workload needs online placement (batch 1)")
		}
		learn = placement.NewLearner(placement.DefaultWorkload(), *cfg.Learn)
		shapes = learn.Workload()
	case shapes == nil:
		shapes = placement.TypicalShapes(cfg.Pods, 1.0)
	}
	newPolicy := func(w placement.Workload) (placement.Policy, error) {
		if cfg.NewPolicy != nil {
			return cfg.NewPolicy(w), nil
		}
		return placement.New(cfg.Policy, w)
	}
	pol, err := newPolicy(shapes)
	if err != nil {
		return nil, err
	}
	s := placement.NewScheduler(c, pol, cfg.Seed)
	capa := float64(c.GPUCapacity())
	seq := Arrivals(cfg.Pods, c.GPUCapacity(), cfg.Tune, cfg.Seed)
	res := &Result{Seed: cfg.Seed, Reasons: map[string]int{}, Decisions: make([]time.Duration, 0, len(seq))}
	var arrived int64
	next := cfg.Step
	batch := make([]*placement.Request, 0, cfg.Batch)
	errs := make([]error, 0, cfg.Batch)
	frac := newFracLog()
	topos := make([]Topology, len(cfg.Nodes))
	for i, n := range cfg.Nodes {
		topos[i] = topologyOf(n)
	}
	placed := func(p placement.Placement) {
		frac.add(c, p)
		// Only multi-GPU pods are counted: the node's GPUs are not read for the rest.
		if len(p.GPUs) > 1 {
			free, _ := c.GPUs(p.Node)
			res.Locality.add(topos[p.Node], p, free)
		}
	}
	for start := 0; start < len(seq); start += cfg.Batch {
		batch = batch[:0]
		for _, k := range seq[start:min(start+cfg.Batch, len(seq))] {
			batch = append(batch, &cfg.Pods[k])
			arrived += cfg.Pods[k].GPUDemand()
		}
		errs = errs[:0]
		if len(batch) > 1 {
			orders := cfg.Orders
			if orders <= 0 {
				orders = placement.BatchOrders
			}
			t0 := time.Now()
			ps, es := s.AllocateBatch(batch, orders)
			per := time.Since(t0) / time.Duration(len(batch))
			for i := range batch {
				res.Decisions = append(res.Decisions, per)
				if es[i] == nil {
					placed(ps[i])
				}
			}
			errs = append(errs, es...)
		} else {
			if learn != nil && learn.Observe(batch[0]) {
				pol, err := newPolicy(learn.Workload())
				if err != nil {
					return nil, err
				}
				s.SetPolicy(pol)
				res.Rebuilds++
			}
			res.Fill = append(res.Fill, (capa-float64(c.GPUFree()))/capa)
			scored := s.Scored()
			t0 := time.Now()
			p, err := s.Allocate(batch[0])
			res.Decisions = append(res.Decisions, time.Since(t0))
			res.Scored = append(res.Scored, int32(s.Scored()-scored))
			errs = append(errs, err)
			if err == nil {
				placed(p)
			}
		}
		for i, r := range batch {
			if err := errs[i]; err != nil {
				var ue *placement.UnplaceableError
				if !errors.As(err, &ue) {
					return nil, fmt.Errorf("pod %s: %w", r.Name, err)
				}
				cl := ClassOf(r)
				res.Failed[cl]++
				res.FailedMilli[cl] += r.GPUDemand()
				res.Reasons[ue.Reason.String()]++
				continue
			}
			res.Placed++
		}
		alloc := (capa - float64(c.GPUFree())) / capa
		for float64(arrived) >= next*capa-1e-6 {
			res.Curve = append(res.Curve, Point{Arrived: next, Alloc: alloc})
			next += cfg.Step
		}
		res.Final = Point{Arrived: float64(arrived) / capa, Alloc: alloc}
	}
	var failed int64
	for _, m := range res.FailedMilli {
		failed += m
	}
	res.Waste = frac.waste(c, res.Final.Alloc, failed)
	if cfg.Inspect != nil {
		cfg.Inspect(cfg.Seed, c)
	}
	return res, nil
}
