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
	// Every is how many requests apart the learned workload is handed to the
	// policy again (a new policy attaches to every node: not once a request).
	Every int
}

// DefaultLearnOptions are the allocator's: a window of a few thousand claims,
// the default workload for the first 200.
func DefaultLearnOptions() LearnOptions {
	return LearnOptions{HalfLife: 2000, MinSeen: 200, Every: 200}
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
}

type shapeKey struct {
	cpu, share int64
	gpus       int
	models     string
}

type learnedShape struct{ w, mem float64 }

// NewLearner returns a learner that gives def until o.MinSeen requests were
// seen. Non-positive options take DefaultLearnOptions' values.
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
// handed to the policy again: when MinSeen requests were first seen, then
// every Every requests.
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
	return l.seen >= l.o.MinSeen && (l.seen-l.o.MinSeen)%l.o.Every == 0
}

// Seen is how many requests were observed.
func (l *Learner) Seen() int { return l.seen }

// Workload is the learned distribution (the default until MinSeen requests
// were seen), most frequent shape first, as TypicalShapes orders it; shapes
// whose weight has decayed below minWeight are forgotten.
func (l *Learner) Workload() Workload {
	if l.seen < l.o.MinSeen {
		return append(Workload(nil), l.def...)
	}
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
