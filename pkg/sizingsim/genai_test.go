package sizingsim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// genaiDirs are where the trace is, when it is at hand: ../shared beside the repository's
// root (as `fgpu sim sizing` defaults to), or beside the worktrees' folder.
var genaiDirs = []string{"../../../shared/traces/genai_v2026", "../../../../shared/traces/genai_v2026"}

func writeTarGz(t *testing.T, path, name, content string) {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestLoadGenAI(t *testing.T) {
	dir := t.TempDir()
	writeTarGz(t, filepath.Join(dir, "pod_gpu_memory_used_bytes_anon.tar.gz"), "m.csv",
		"timestamp_anon,value,container_ip\n100.0,1000.0,a\n157.0,2000.0,a\n271.0,4000.0,a\n157.0,500.0,b\n")
	writeTarGz(t, filepath.Join(dir, "pod_gpu_duty_cycle_anon.tar.gz"), "d.csv",
		"value,timestamp_anon,container_ip\n12.6,100.0,a\n99.9,157.0,b\n")
	tr, err := LoadGenAI(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tr.StepSeconds != 57 || tr.Steps != 4 || len(tr.Containers) != 2 {
		t.Fatalf("trace %+v", tr)
	}
	a, b := tr.Containers[0], tr.Containers[1]
	// The missing step at 214 s holds the last value.
	if a.Start != 0 || len(a.Memory) != 4 || a.Memory[2] != 2000 || a.Memory[3] != 4000 || a.SM[0] != 13 || a.SM[1] != -1 {
		t.Errorf("container a %+v", a)
	}
	if b.Start != 1 || len(b.Memory) != 1 || b.SM[0] != 100 {
		t.Errorf("container b %+v", b)
	}
	writeTarGz(t, filepath.Join(dir, "pod_gpu_duty_cycle_anon.tar.gz"), "d.csv", "value,when,container_ip\n1,2,a\n")
	if _, err := LoadGenAI(dir); err == nil {
		t.Error("a CSV without timestamp_anon loaded")
	}
}

// Two containers whose peaks come apart: the fixed strategies and the oracle are exact, and
// Auto shrinks an idle container after its history and counts its growth past the cap.
func TestRunStrategies(t *testing.T) {
	const gib = int64(1) << 30
	steady := make([]int64, 200)
	for i := range steady {
		steady[i] = 30 * gib
	}
	grows := make([]int64, 200)
	for i := range grows {
		grows[i] = 10 * gib
		if i >= 150 {
			grows[i] = 35 * gib
		}
	}
	sm := make([]int, 200)
	tr := &Trace{StepSeconds: 60, Steps: 200, Containers: []Container{{ID: "a", Memory: steady, SM: sm}, {ID: "b", Memory: grows, SM: sm}}}
	opts := DefaultOptions(60)
	opts.Sizing.MinSamples = 60
	got := map[string]Result{}
	for _, r := range Run(tr, opts, nil) {
		got[r.Strategy] = r
	}
	if r := got["whole"]; r.GPUsPeak != 2 || r.GPUsMean != 2 || r.Violations != 0 {
		t.Errorf("whole %+v", r)
	}
	// 32 + 40 GiB share one GPU.
	if r := got["human"]; r.GPUsPeak != 1 || r.ContainersPerGPU != 2 || r.Violations != 0 {
		t.Errorf("human %+v", r)
	}
	if r := got["oracle"]; r.GPUsPeak != 1 {
		t.Errorf("oracle %+v", r)
	}
	if r := got["initial"]; r.GPUsPeak != 2 || r.Violations != 0 {
		t.Errorf("initial %+v; want a whole GPU each, never violated", r)
	}
	r := got["auto-per-claim"]
	if r.GPUsPeak != 2 || r.GPUsMean >= 2 || r.Restarts < 2 || r.Violations != 1 {
		t.Errorf("auto-per-claim %+v; want both shrunk after the history onto one GPU, and b's jump past its cap one violation", r)
	}
	if hours := 400.0 / 60; r.ViolationsPer100h < 100/hours-1e-9 || r.ViolationsPer100h > 100/hours+1e-9 {
		t.Errorf("violations per 100h %v; want %v", r.ViolationsPer100h, 100/hours)
	}
}

// genaiTrace loads the real trace, or skips the test where it is not at hand.
func genaiTrace(t *testing.T) *Trace {
	t.Helper()
	for _, d := range genaiDirs {
		if _, err := os.Stat(d); err == nil {
			tr, err := LoadGenAI(d)
			if err != nil {
				t.Fatal(err)
			}
			return tr
		}
	}
	t.Skip("genai_v2026 trace not here")
	return nil
}

// The real trace, where it is at hand: the orders the figures must keep, and the targets
// for Auto at the defaults that the allocator's own rules meet: fewer GPUs than the human and
// than per-claim caps, under one violation per 100 container-hours. The third target, at
// most half of whole's GPUs, was met only by the simulator's former copy of the burst model;
// the allocator's rules need 6.4 GPUs more, and docs/sizing.md says which rules and why.
func TestGenAITargets(t *testing.T) {
	tr := genaiTrace(t)
	got := map[string]Result{}
	for _, r := range Run(tr, DefaultOptions(tr.StepSeconds), nil) {
		got[r.Strategy] = r
		t.Logf("%+v", r)
	}
	whole, human, oracle, auto := got["whole"], got["human"], got["oracle"], got["auto"]
	if len(tr.Containers) != 144 || !(oracle.GPUsMean < human.GPUsMean && human.GPUsMean < whole.GPUsMean) {
		t.Errorf("%d containers; figures %+v", len(tr.Containers), got)
	}
	if auto.GPUsMean >= human.GPUsMean {
		t.Errorf("auto needs %.1f GPUs, the human %.1f: want fewer", auto.GPUsMean, human.GPUsMean)
	}
	if auto.ViolationsPer100h >= 1 {
		t.Errorf("auto has %.2f violations per 100 container-hours: want under 1", auto.ViolationsPer100h)
	}
	if auto.GPUsMean >= got["auto-per-claim"].GPUsMean {
		t.Errorf("auto needs %.1f GPUs, per-claim auto %.1f: want fewer", auto.GPUsMean, got["auto-per-claim"].GPUsMean)
	}
}

// halfBusy is n steps of 50% SM activity: neither a busy workload (which keeps its whole
// GPU) nor a mostly idle one (time-sliced), so Auto lets it burst.
func halfBusy(n int) []int {
	sm := make([]int, n)
	for i := range sm {
		sm[i] = 50
	}
	return sm
}

// Three bursters that fit two to a GPU (25 GiB each, 69.6 GiB admitted): once a leaves, b
// and c hold a GPU each, and the next report empties one of them, with no violation.
func TestAutoEmptiesAGPUWhoseTenantsFitElsewhere(t *testing.T) {
	const gib = int64(1) << 30
	steady := func(n int) []int64 {
		m := make([]int64, n)
		for i := range m {
			m[i] = 25 * gib
		}
		return m
	}
	sm := halfBusy(300)
	tr := &Trace{StepSeconds: 60, Steps: 300, Containers: []Container{
		{ID: "a", Memory: steady(150), SM: sm[:150]},
		{ID: "b", Memory: steady(300), SM: sm},
		{ID: "c", Memory: steady(300), SM: sm},
	}}
	opts := DefaultOptions(60)
	opts.Sizing.MinSamples = 60
	r := Auto(tr, opts, nil)
	// Without the move: three GPUs for the history, then two to the end.
	unmoved := (59*3 + 241*2) / 300.0
	if r.Consolidations != 1 || r.Violations != 0 || r.GPUsMean > unmoved-0.4 {
		t.Errorf("%+v; want one restart that empties a GPU for the last ~145 steps (mean under %.2f), no violation", r, unmoved-0.4)
	}
}

// Two containers whose short peaks alternate share one GPU under Auto, guaranteed their
// typical use and capped at twice their peaks (the whole GPU each), but not under per-claim
// Auto, whose caps never add up to more than the GPU; when their peaks later coincide past
// the GPU's memory, someone's allocation fails and that counts.
func TestAutoSharesNonCoincidingPeaks(t *testing.T) {
	const gib = int64(1) << 30
	phase := func(from int, both int64) []int64 {
		m := make([]int64, 200)
		for i := range m {
			m[i] = 5 * gib
			if (i/10)%4 == from {
				m[i] = 40 * gib
			}
			if both > 0 && i >= 150 {
				m[i] = both
			}
		}
		return m
	}
	sm := halfBusy(200)
	opts := DefaultOptions(60)
	opts.Sizing.MinSamples = 60
	trace := func(both int64) *Trace {
		return &Trace{StepSeconds: 60, Steps: 200, Containers: []Container{
			{ID: "a", Memory: phase(0, both), SM: sm},
			{ID: "b", Memory: phase(2, both), SM: sm},
		}}
	}
	r := Auto(trace(0), opts, nil)
	if r.GPUsPeak != 2 || r.GPUsMeanWarm != 1 || r.Violations != 0 || r.Restarts != 2 {
		t.Errorf("auto, alternating peaks: %+v; want a whole GPU each for the history, then one shared GPU, no violation, one restart each", r)
	}
	if r := AutoPerClaim(trace(0), opts, nil); r.GPUsMeanWarm != 2 {
		t.Errorf("auto-per-claim, alternating peaks: %+v; want a GPU each throughout", r)
	}
	r = Auto(trace(45*gib), opts, nil)
	if r.OverfullViolations == 0 || r.Violations != r.OverfullViolations {
		t.Errorf("coinciding peaks of 90 GiB on an 80 GiB GPU: %+v; want over-full violations only", r)
	}
}

// A GPU that a container holds whole, having no recommendation yet, admits no burster: a,
// a burster since step 60, runs out of its 10 GiB cap at step 170 and restarts on a GPU of
// its own, though b, which started at step 150 and holds a whole GPU, uses only 5 GiB.
func TestAutoNoBursterBesideWholeGPU(t *testing.T) {
	const gib = int64(1) << 30
	a := make([]int64, 200)
	for i := range a {
		a[i] = 5 * gib
		if i >= 170 {
			a[i] = 12 * gib
		}
	}
	b := make([]int64, 50)
	for i := range b {
		b[i] = 5 * gib
	}
	tr := &Trace{StepSeconds: 60, Steps: 200, Containers: []Container{
		{ID: "a", Memory: a, SM: halfBusy(200)},
		{ID: "b", Start: 150, Memory: b, SM: halfBusy(50)},
	}}
	opts := DefaultOptions(60)
	opts.Sizing.MinSamples = 60
	r := Auto(tr, opts, nil)
	// One GPU until b starts, then two.
	if want := (150*1 + 50*2) / 200.0; r.GPUsPeak != 2 || r.GPUsMean != want || r.Violations != 1 {
		t.Errorf("%+v; want GPUs mean %v, one violation", r, want)
	}
}

// The figures docs/sizing.md gives for auto are the allocator's: `fgpu sim sizing` (Run)
// replays the trace through pkg/sizing/engine, the code the allocator decides with, and
// gets these.
func TestGenAIAutoIsTheAllocatorsEngine(t *testing.T) {
	tr := genaiTrace(t)
	opts := DefaultOptions(tr.StepSeconds)
	r := Auto(tr, opts, nil)
	for _, got := range Run(tr, opts, nil) {
		if got.Strategy == "auto" && got != r {
			t.Errorf("fgpu sim sizing's auto %+v, the engine's replay %+v", got, r)
		}
	}
	if mean := fmt.Sprintf("%.1f", r.GPUsMean); mean != "62.8" || r.Violations != 6 || r.OverfullViolations != 6 || r.Restarts != 158 {
		t.Errorf("%+v; docs/sizing.md gives 62.8 GPUs, 6 violations (all a GPU over-full), 158 restarts", r)
	}
}
