package placement

import (
	"strings"
)

// Shape is one kind of request and how often it occurs: the fragmentation
// measure asks, for each shape, whether a node's free GPUs could still host it.
type Shape struct {
	CPUMilli int64
	GPUs     int
	Share    int64 // per GPU, milli; 1000 for whole GPUs, 0 when GPUs == 0
	Models   string
	Weight   float64 // probability; the weights of a Workload sum to 1
	// MemoryMiB is the mean memory of the requests of this shape (not part
	// of the shape: FGD ignores memory; fgpu's node values use it).
	MemoryMiB int64
}

// Workload is the distribution of request shapes a policy expects.
type Workload []Shape

// ShapeOf is the shape of a request (milli-GPU shares).
func ShapeOf(r *Request) Shape {
	s := Shape{CPUMilli: r.CPUMilli, GPUs: r.GPUs, Models: strings.Join(r.Models, "|")}
	if r.GPUs > 0 {
		s.Share = r.Share
		if r.Whole() || s.Share > DefaultGPUCapacity {
			s.Share = DefaultGPUCapacity
		}
	}
	return s
}

// TypicalShapes counts the shapes of reqs and keeps the most common ones,
// ten at a time, until they cover popularity (0..1) of all requests; weights
// are renormalised over the kept shapes. This is the FGD paper's "typical
// pods" with its artifact's defaults (95%, steps of 10).
func TypicalShapes(reqs []Request, popularity float64) Workload {
	return TypicalShapesStep(reqs, popularity, 10)
}

// TypicalShapesStep is TypicalShapes adding step shapes at a time (the
// artifact's experiment scripts pass 1).
func TypicalShapesStep(reqs []Request, popularity float64, step int) Workload {
	if step < 1 {
		step = 1
	}
	type key struct {
		cpu, share int64
		gpus       int
		models     string
	}
	count, mem := map[key]float64{}, map[key]float64{}
	for i := range reqs {
		s := ShapeOf(&reqs[i])
		k := key{s.CPUMilli, s.Share, s.GPUs, s.Models}
		count[k]++
		mem[k] += float64(reqs[i].MemoryMiB)
	}
	w := make(Workload, 0, len(count))
	for k, v := range count {
		w = append(w, Shape{CPUMilli: k.cpu, GPUs: k.gpus, Share: k.share, Models: k.models, Weight: v, MemoryMiB: int64(mem[k] / v)})
	}
	sortShapes(w)
	total := float64(len(reqs))
	kept, cum := 0, 0.0
	for cum < popularity*total && kept < len(w) {
		for end := min(kept+step, len(w)); kept < end; kept++ {
			cum += w[kept].Weight
		}
	}
	w = w[:kept]
	for i := range w {
		w[i].Weight /= cum
	}
	return w
}
