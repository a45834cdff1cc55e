package placement

import (
	"math"
	"sort"
)

// LearnOptions size a Learner.
type LearnOptions struct {
	// HalfLife is how many requests later a request's weight is halved.
	HalfLife int
	// MinSeen is how many requests must be seen before the learned workload
	// replaces the default.
	MinSeen int
	// Every is how many requests apart the learned workload is checked (a new
	// policy attaches to every node: not once a request).
	Every int
	// MinMove is how far (total variation distance, 0..1: the weight that
	// moved between shapes) the learned workload must have moved from the one
	// last handed to the policy for a check to hand it over again. A policy is
	// rebuilt only for a workload that changed; 0 hands it over at every check.
	MinMove float64
}

// DefaultLearnOptions are the allocator's: a window of a few thousand claims,
// the default workload for the first 200, handed over again once 5% of its
// weight moved. Checked every 200 claims, a steady openb workload moves about
// 1.5% between checks, most of it the window's sampling noise.
func DefaultLearnOptions() LearnOptions {
	return LearnOptions{HalfLife: 2000, MinSeen: 200, Every: 200, MinMove: 0.05}
}

// DefaultWorkload is what a Learner gives until it has seen enough requests: shares of an
// eighth, a quarter, a half and a whole GPU.
func DefaultWorkload() Workload {
	return Workload{
		{GPUs: 1, Share: 125, Weight: 0.3},
		{GPUs: 1, Share: 250, Weight: 0.3},
		{GPUs: 1, Share: 500, Weight: 0.2},
		{GPUs: 1, Share: 1000, Weight: 0.2},
	}
}

// minWeight drops a learned shape once its share of the window falls below
// it, so the learner stays small however many shapes went by.
const minWeight = 1e-4

// Learner learns the workload distribution from the requests seen, each
// weighted by how recent it is (a decaying window), and gives the default
// until enough were seen. The allocator feeds it every claim it decides, the
// simulator every pod that arrives (sim.Config.Learn): the fragmentation-aware
// policy then measures against the same workload in both.
type Learner struct {
	o      LearnOptions
	def    Workload
	seen   int
	scale  float64 // weight of the next request: older ones decay relative to it
	growth float64
	shapes map[shapeKey]*learnedShape
	// handed is the workload last handed to the policy (nil before the
	// first), handedW its weights by shape.
	handed  Workload
	handedW map[shapeKey]float64
}

type shapeKey struct {
	cpu, share int64
	gpus       int
	models     string
}

type learnedShape struct{ w, mem float64 }

// NewLearner returns a learner that gives def until o.MinSeen requests were
// seen. Non-positive HalfLife, MinSeen and Every take DefaultLearnOptions'
// values; MinMove is taken as it is.
func NewLearner(def Workload, o LearnOptions) *Learner {
	d := DefaultLearnOptions()
	if o.HalfLife <= 0 {
		o.HalfLife = d.HalfLife
	}
	if o.MinSeen <= 0 {
		o.MinSeen = d.MinSeen
	}
	if o.Every <= 0 {
		o.Every = d.Every
	}
	return &Learner{o: o, def: def, scale: 1, growth: math.Exp2(1 / float64(o.HalfLife)), shapes: map[shapeKey]*learnedShape{}}
}

// Observe counts one request. It reports whether the workload should be
// handed to the policy again: when MinSeen requests were first seen, then at
// every Every requests where it moved at least MinMove since it was last
// handed over. The simulator and the allocator ask the same learner the same
// way, so their policies change at the same requests.
func (l *Learner) Observe(r *Request) bool {
	s := ShapeOf(r)
	k := shapeKey{s.CPUMilli, s.Share, s.GPUs, s.Models}
	e := l.shapes[k]
	if e == nil {
		e = &learnedShape{}
		l.shapes[k] = e
	}
	e.w += l.scale
	e.mem += l.scale * float64(r.MemoryMiB)
	l.seen++
	l.scale *= l.growth
	if l.scale > 1e100 {
		for _, e := range l.shapes {
			e.w /= l.scale
			e.mem /= l.scale
		}
		l.scale = 1
	}
	if l.seen < l.o.MinSeen || (l.seen-l.o.MinSeen)%l.o.Every != 0 {
		return false
	}
	w := l.learned()
	cur := make(map[shapeKey]float64, len(w))
	for _, s := range w {
		cur[shapeKey{s.CPUMilli, s.Share, s.GPUs, s.Models}] = s.Weight
	}
	if l.handed != nil && l.o.MinMove > 0 && moved(w, cur, l.handed, l.handedW) < l.o.MinMove {
		return false
	}
	l.handed, l.handedW = w, cur
	return true
}

// moved is the total variation distance between workloads a and b (aw and bw
// their weights by shape), summed in the workloads' order: the same in every
// run, however close to MinMove.
func moved(a Workload, aw map[shapeKey]float64, b Workload, bw map[shapeKey]float64) float64 {
	var d float64
	for _, s := range a {
		d += math.Abs(s.Weight - bw[shapeKey{s.CPUMilli, s.Share, s.GPUs, s.Models}])
	}
	for _, s := range b {
		if _, ok := aw[shapeKey{s.CPUMilli, s.Share, s.GPUs, s.Models}]; !ok {
			d += s.Weight
		}
	}
	return d / 2
}

// Seen is how many requests were observed.
func (l *Learner) Seen() int { return l.seen }

// Workload is the workload last handed over (Observe), most frequent shape
// first, as TypicalShapes orders it: the default before MinSeen requests were
// seen.
func (l *Learner) Workload() Workload {
	if l.handed == nil {
		return append(Workload(nil), l.def...)
	}
	return append(Workload(nil), l.handed...)
}

// learned is the distribution learned so far; shapes whose weight has
// decayed below minWeight are forgotten.
func (l *Learner) learned() Workload {
	var total float64
	for _, e := range l.shapes {
		total += e.w
	}
	w := make(Workload, 0, len(l.shapes))
	for k, e := range l.shapes {
		if e.w < minWeight*total {
			delete(l.shapes, k)
			continue
		}
		w = append(w, Shape{CPUMilli: k.cpu, GPUs: k.gpus, Share: k.share, Models: k.models, Weight: e.w, MemoryMiB: int64(e.mem / e.w)})
	}
	sortShapes(w)
	var kept float64
	for i := range w {
		kept += w[i].Weight
	}
	for i := range w {
		w[i].Weight /= kept
	}
	return w
}

// sortShapes orders shapes most frequent first; equal weights in a fixed
// order, so runs repeat.
func sortShapes(w Workload) {
	sort.Slice(w, func(i, j int) bool {
		a, b := w[i], w[j]
		if a.Weight != b.Weight {
			return a.Weight > b.Weight
		}
		if a.CPUMilli != b.CPUMilli {
			return a.CPUMilli > b.CPUMilli
		}
		if a.Share != b.Share {
			return a.Share > b.Share
		}
		if a.GPUs != b.GPUs {
			return a.GPUs > b.GPUs
		}
		return a.Models > b.Models
	})
}
