package sizing

import (
	"math"
	"time"
)

// Histogram is a decaying histogram of one measure, after the one Kubernetes' VPA recommender
// keeps: buckets grow geometrically (so relative precision is the same at 1 GiB and 80 GiB),
// and a sample's weight doubles every half-life after a reference time, so that older
// samples count for less without being dropped. Weights are kept relative to the reference,
// which moves forward when they would grow too large.
type Histogram struct {
	first, ratio float64
	halfLife     time.Duration
	ref          time.Time
	weights      []float64
	total        float64
}

// NewHistogram makes a histogram whose first bucket is [0, first), each next one ratio times
// as wide, up to at least maxValue.
func NewHistogram(first, ratio, maxValue float64, halfLife time.Duration) *Histogram {
	n := 1
	for upper := first; upper < maxValue; n++ {
		upper += first * math.Pow(ratio, float64(n))
	}
	return &Histogram{first: first, ratio: ratio, halfLife: halfLife, weights: make([]float64, n)}
}

// bucketStart is the lower bound of bucket i.
func (h *Histogram) bucketStart(i int) float64 {
	if i == 0 {
		return 0
	}
	// The sum of first*ratio^k for k < i.
	return h.first * (math.Pow(h.ratio, float64(i)) - 1) / (h.ratio - 1)
}

func (h *Histogram) bucket(v float64) int {
	if v < h.first {
		return 0
	}
	i := int(math.Floor(math.Log(v*(h.ratio-1)/h.first+1) / math.Log(h.ratio)))
	// Floating point can land one off at a bound.
	for i > 0 && h.bucketStart(i) > v {
		i--
	}
	for i+1 < len(h.weights) && h.bucketStart(i+1) <= v {
		i++
	}
	return min(i, len(h.weights)-1)
}

// maxExponent bounds the decay factor of a new sample (2^maxExponent) before the weights
// are rescaled to a later reference.
const maxExponent = 100

// Add records value with weight at time at.
func (h *Histogram) Add(value, weight float64, at time.Time) {
	if weight <= 0 || math.IsNaN(value) {
		return
	}
	if h.ref.IsZero() {
		h.ref = at
	}
	exp := at.Sub(h.ref).Seconds() / h.halfLife.Seconds()
	if exp > maxExponent {
		h.rescale(at)
		exp = 0
	}
	w := weight * math.Exp2(exp)
	h.weights[h.bucket(max(value, 0))] += w
	h.total += w
}

// rescale moves the reference to at, dividing the weights by the decay between.
func (h *Histogram) rescale(at time.Time) {
	f := math.Exp2(-at.Sub(h.ref).Seconds() / h.halfLife.Seconds())
	h.total = 0
	for i := range h.weights {
		h.weights[i] *= f
		h.total += h.weights[i]
	}
	h.ref = at
}

// Empty says whether nothing was added.
func (h *Histogram) Empty() bool { return h.total == 0 }

// Percentile is the upper bound of the bucket where the weights reach fraction p (0-1) of the
// total: the value at or below which that share of the decayed weight lies, rounded up to
// the bucket (never below it, which suits sizing). 0 when empty.
func (h *Histogram) Percentile(p float64) float64 {
	if h.total == 0 {
		return 0
	}
	threshold := p * h.total
	sum := 0.0
	last := 0
	for i, w := range h.weights {
		if w == 0 {
			continue
		}
		last = i
		sum += w
		if sum >= threshold*(1-1e-12) {
			return h.bucketStart(i + 1)
		}
	}
	return h.bucketStart(last + 1)
}
