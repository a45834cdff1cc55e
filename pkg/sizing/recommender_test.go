package sizing

import (
	"fmt"
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func TestRecommenderWaitsForSamplesThenSizesAboveThePeak(t *testing.T) {
	opts := DefaultOptions()
	r := NewRecommender(opts)
	w := api.SizingWorkload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	report := func(share string, i int, peakGiB float64, sm int) api.ShareUsage {
		return api.ShareUsage{From: t0.Add(time.Duration(i-1) * 5 * time.Minute), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
			MemoryMaxBytes: int64(peakGiB * (1 << 30)), SMSamples: 30, SMP95Percent: sm}
	}
	// 5 reports of 30 samples: 150 < 180.
	for i := 1; i <= 5; i++ {
		if !r.Add(w, "s1", report("s1", i, 6+float64(i%3), 40)) {
			t.Fatalf("report %d not taken", i)
		}
	}
	if _, ok := r.Recommend(w); ok {
		t.Fatal("recommended on 150 samples")
	}
	if r.Add(w, "s1", report("s1", 5, 99, 40)) {
		t.Fatal("the same report taken twice")
	}
	// A second pod of the workload adds to the same history.
	if !r.Add(w, "s2", report("s2", 1, 7.5, 60)) {
		t.Fatal("second share's report not taken")
	}
	rec, ok := r.Recommend(w)
	if !ok {
		t.Fatal("no recommendation on 180 samples")
	}
	if rec.PeakBytes != 8<<30 || rec.MemoryBytes < rec.PeakBytes || rec.MemoryBytes > 10<<30 || rec.MemoryBytes%MemoryStep != 0 {
		t.Errorf("memory %d (%.2f GiB) for an 8 GiB peak; want above it with ~15%% headroom, in 256Mi steps", rec.MemoryBytes, float64(rec.MemoryBytes)/(1<<30))
	}
	if rec.ComputePercent < 46 || rec.ComputePercent > 72 {
		t.Errorf("compute %d%%; want ~p90 of 40-60%% with headroom", rec.ComputePercent)
	}
	other := api.SizingWorkload{Namespace: "team-b", Kind: "Deployment", Name: "web", Request: "gpu"}
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
	w := api.SizingWorkload{Namespace: "ns", Kind: "StatefulSet", Name: "db", Request: "gpu"}
	t0 := time.Unix(0, 0)
	at := t0
	add := func(n int, gib int64) {
		for range n {
			at = at.Add(5 * time.Minute)
			r.Add(w, "s", api.ShareUsage{To: at, Samples: 30, MemoryMaxBytes: gib << 30})
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

// A workload no claim reports for ForgetAfterHalfLives half-lives is forgotten, with its
// shares; one that reports stays.
func TestRecommenderForgetsSilentWorkloads(t *testing.T) {
	opts := DefaultOptions()
	opts.HalfLife = time.Hour
	opts.MinSamples = 1
	r := NewRecommender(opts)
	gone := api.SizingWorkload{Namespace: "ns", Kind: "Pod", Name: "once", Request: "gpu"}
	live := api.SizingWorkload{Namespace: "ns", Kind: "Deployment", Name: "web", Request: "gpu"}
	t0 := time.Unix(0, 0)
	r.Add(gone, "s1", api.ShareUsage{To: t0, Samples: 30, MemoryMaxBytes: 4 << 30})
	for i := range 10 {
		r.Add(live, "s2", api.ShareUsage{To: t0.Add(time.Duration(i) * time.Hour), Samples: 30, MemoryMaxBytes: 4 << 30})
	}
	r.Prune(t0.Add(ForgetAfterHalfLives*time.Hour - time.Minute))
	if !r.Has(gone) {
		t.Fatal("forgotten before ForgetAfterHalfLives half-lives")
	}
	r.Prune(t0.Add(ForgetAfterHalfLives*time.Hour + time.Minute))
	if _, ok := r.Recommend(gone); ok || r.Has(gone) {
		t.Error("a workload silent for 8 half-lives is still kept")
	}
	if _, ok := r.Recommend(live); !ok {
		t.Error("a workload that reports was forgotten")
	}
	if _, ok := r.last["s1"]; ok {
		t.Error("the silent workload's share is still kept")
	}
	if got := r.Workloads(); len(got) != 1 || got[0] != live {
		t.Errorf("workloads %v; want only %v", got, live)
	}
}

// Each namespace keeps at most MaxWorkloadsPerNamespace histories: a new workload replaces
// the namespace's longest silent one, and other namespaces keep theirs.
func TestRecommenderBoundsWorkloadsPerNamespace(t *testing.T) {
	opts := DefaultOptions()
	opts.MinSamples = 1
	r := NewRecommender(opts)
	t0 := time.Unix(0, 0)
	pod := func(ns string, i int) api.SizingWorkload {
		return api.SizingWorkload{Namespace: ns, Kind: "Pod", Name: fmt.Sprintf("p-%d", i), Request: "gpu"}
	}
	other := pod("team-b", 0)
	r.Add(other, "b", api.ShareUsage{To: t0, Samples: 1, MemoryMaxBytes: 1 << 30})
	for i := range MaxWorkloadsPerNamespace {
		r.Add(pod("team-a", i), fmt.Sprintf("a-%d", i), api.ShareUsage{To: t0.Add(time.Duration(i+1) * time.Minute), Samples: 1, MemoryMaxBytes: 1 << 30})
	}
	// p-0 reports again: p-1 is now the longest silent.
	r.Add(pod("team-a", 0), "a-0", api.ShareUsage{To: t0.Add(time.Duration(MaxWorkloadsPerNamespace+1) * time.Minute), Samples: 1, MemoryMaxBytes: 1 << 30})
	newest := pod("team-a", MaxWorkloadsPerNamespace)
	r.Add(newest, "new", api.ShareUsage{To: t0.Add(time.Duration(MaxWorkloadsPerNamespace+2) * time.Minute), Samples: 1, MemoryMaxBytes: 1 << 30})
	if got := len(r.Workloads()); got != MaxWorkloadsPerNamespace+1 {
		t.Errorf("%d workloads; want %d in team-a and 1 in team-b", got, MaxWorkloadsPerNamespace)
	}
	if r.Has(pod("team-a", 1)) {
		t.Error("the longest silent workload of team-a is still kept")
	}
	for _, w := range []api.SizingWorkload{pod("team-a", 0), pod("team-a", 2), newest, other} {
		if !r.Has(w) {
			t.Errorf("%v was forgotten", w)
		}
	}
}
