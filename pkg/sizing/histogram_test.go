package sizing

import (
	"math"
	"testing"
	"time"
)

func TestHistogramBucketsCoverTheRange(t *testing.T) {
	h := NewHistogram(1, 1.05, 1000, time.Hour)
	if h.bucketStart(len(h.weights)) < 1000 {
		t.Fatalf("buckets end at %v, below 1000", h.bucketStart(len(h.weights)))
	}
	for _, v := range []float64{0, 0.5, 1, 1.04, 1.05, 2.05, 50, 999, 5000} {
		i := h.bucket(v)
		if v < h.bucketStart(len(h.weights)) && (h.bucketStart(i) > v || h.bucketStart(i+1) <= v) {
			t.Errorf("value %v in bucket %d [%v, %v)", v, i, h.bucketStart(i), h.bucketStart(i+1))
		}
	}
	if h.bucket(5000) != len(h.weights)-1 {
		t.Error("a value past the range is not in the last bucket")
	}
}

func TestHistogramPercentile(t *testing.T) {
	h := NewHistogram(1, 1.05, 1000, time.Hour)
	if h.Percentile(0.9) != 0 || !h.Empty() {
		t.Fatal("an empty histogram has a percentile")
	}
	t0 := time.Unix(0, 0)
	for v := 1; v <= 100; v++ {
		h.Add(float64(v), 1, t0)
	}
	for _, tc := range []struct{ p, want float64 }{{0.5, 50}, {0.9, 90}, {1, 100}} {
		got := h.Percentile(tc.p)
		// Never below the value, at most one bucket (5%) above it.
		if got < tc.want || got > tc.want*1.05+1e-9 {
			t.Errorf("p%v = %v, want in [%v, %v]", tc.p, got, tc.want, tc.want*1.05)
		}
	}
}

// A sample a half-life newer weighs twice as much: old peaks fade, and a workload that
// shrank is sized down once its recent samples outweigh them.
func TestHistogramDecays(t *testing.T) {
	h := NewHistogram(1, 1.05, 1000, time.Hour)
	t0 := time.Unix(0, 0)
	h.Add(100, 1, t0)
	h.Add(10, 1, t0.Add(time.Hour))
	// 10 has 2/3 of the weight.
	if got := h.Percentile(0.6); got > 11.5 {
		t.Errorf("p60 = %v; want the newer 10", got)
	}
	if got := h.Percentile(0.7); got < 100 {
		t.Errorf("p70 = %v; want the older 100", got)
	}
	// Far in the future the weights are rescaled and stay finite.
	far := t0.Add(1000 * time.Hour)
	h.Add(50, 1, far)
	if math.IsInf(h.total, 0) || math.IsNaN(h.total) {
		t.Fatalf("total %v after a long gap", h.total)
	}
	if got := h.Percentile(0.99); got < 50 || got > 53 {
		t.Errorf("after 1000 half-lives p99 = %v; want the new 50 alone", got)
	}
}
