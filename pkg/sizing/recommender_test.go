package sizing

import (
	"testing"
	"time"
)

func TestRecommenderWaitsForSamplesThenSizesAboveThePeak(t *testing.T) {
	opts := DefaultOptions()
	r := NewRecommender(opts)
	w := Workload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	report := func(share string, i int, peakGiB float64, sm int) Usage {
		return Usage{From: t0.Add(time.Duration(i-1) * 5 * time.Minute), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
			MemoryMaxBytes: int64(peakGiB * (1 << 30)), SMSamples: 30, SMP95Percent: sm}
	}
	// 11 reports of 30 samples: 330 < 360.
	for i := 1; i <= 11; i++ {
		if !r.Add(w, "s1", report("s1", i, 6+float64(i%3), 40)) {
			t.Fatalf("report %d not taken", i)
		}
	}
	if _, ok := r.Recommend(w); ok {
		t.Fatal("recommended on 330 samples")
	}
	if r.Add(w, "s1", report("s1", 11, 99, 40)) {
		t.Fatal("the same report taken twice")
	}
	// A second pod of the workload adds to the same history.
	if !r.Add(w, "s2", report("s2", 1, 7.5, 60)) {
		t.Fatal("second share's report not taken")
	}
	rec, ok := r.Recommend(w)
	if !ok {
		t.Fatal("no recommendation on 360 samples")
	}
	if rec.PeakBytes != 8<<30 || rec.MemoryBytes < rec.PeakBytes || rec.MemoryBytes > 10<<30 || rec.MemoryBytes%MemoryStep != 0 {
		t.Errorf("memory %d (%.2f GiB) for an 8 GiB peak; want above it with ~15%% headroom, in 256Mi steps", rec.MemoryBytes, float64(rec.MemoryBytes)/(1<<30))
	}
	if rec.ComputePercent < 46 || rec.ComputePercent > 72 {
		t.Errorf("compute %d%%; want ~p90 of 40-60%% with headroom", rec.ComputePercent)
	}
	other := Workload{Namespace: "team-b", Kind: "Deployment", Name: "web", Request: "gpu"}
	if _, ok := r.Recommend(other); ok {
		t.Error("another namespace's workload of the same name got a recommendation")
	}
}

// A workload that shrinks is sized down as the half-life passes.
func TestRecommenderFollowsAShrinkingWorkload(t *testing.T) {
	opts := DefaultOptions()
	opts.HalfLife = time.Hour
	opts.MinSamples = 1
	r := NewRecommender(opts)
	w := Workload{Namespace: "ns", Kind: "StatefulSet", Name: "db", Request: "gpu"}
	t0 := time.Unix(0, 0)
	at := t0
	add := func(n int, gib int64) {
		for range n {
			at = at.Add(5 * time.Minute)
			r.Add(w, "s", Usage{To: at, Samples: 30, MemoryMaxBytes: gib << 30})
		}
	}
	add(12, 20)
	before, _ := r.Recommend(w)
	add(12*8, 4) // eight half-lives at 4 GiB
	after, _ := r.Recommend(w)
	if before.MemoryBytes < 20<<30 || after.MemoryBytes > 5<<30 {
		t.Errorf("before %d, after %d; want >= 20 GiB then <= 5 GiB", before.MemoryBytes>>20, after.MemoryBytes>>20)
	}
	if after.ComputePercent != 100 {
		t.Errorf("compute %d with no SM samples; want 100 (nothing measured, nothing taken away)", after.ComputePercent)
	}
}
