package sizing

import (
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func TestWindowSummary(t *testing.T) {
	var w Window
	if _, ok := w.Summary(); ok {
		t.Fatal("an empty window has a summary")
	}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 100 {
		sm := i
		if i%2 == 1 {
			sm = -1 // no SM sample for this one
		}
		w.Add(Sample{At: t0.Add(time.Duration(i) * 10 * time.Second), MemoryBytes: int64(i+1) << 20, SMPercent: sm})
	}
	u, ok := w.Summary()
	if !ok {
		t.Fatal("no summary")
	}
	want := api.ShareUsage{From: t0, To: t0.Add(990 * time.Second), Samples: 100,
		MemoryMaxBytes: 100 << 20, MemoryP95Bytes: 95 << 20, MemoryMeanBytes: (101 << 20) / 2,
		SMSamples: 50, SMMaxPercent: 98, SMP95Percent: 94, SMMeanPercent: 49}
	if u != want {
		t.Fatalf("Summary = %+v\nwant      %+v", u, want)
	}
	w.Reset()
	if w.Len() != 0 {
		t.Fatal("Reset kept samples")
	}
}

// A window folded again and again while its publication waits stays small, and summarises
// as the whole series would: the count, span, mean and maxima exactly, the 95th percentile
// that of memory never below the exact one and at most 1 % above it, that of SM exact.
func TestWindowFolds(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var folded, whole Window
	// A day at a poll every 10 s: a busy hour a day, a memory that moves.
	for i := range 8640 {
		mem := int64((i*7919)%4096+1) << 20
		sm := (i * 31) % 40
		if i >= 3000 && i < 3360 {
			mem, sm = mem+(20<<30), 90+i%10
		}
		if i%5 == 0 {
			sm = -1
		}
		s := Sample{At: t0.Add(time.Duration(i) * 10 * time.Second), MemoryBytes: mem, SMPercent: sm}
		folded.Add(s)
		whole.Add(s)
		if folded.Len() > 1024 {
			folded.Fold(512)
		}
		if folded.Len() > 1024 || len(folded.folded.mem) > 1000 || len(folded.folded.sm) > 101 {
			t.Fatalf("after %d samples: %d kept, %d memory buckets and %d SM values folded", i+1, folded.Len(), len(folded.folded.mem), len(folded.folded.sm))
		}
	}
	got, _ := folded.Summary()
	want, _ := whole.Summary()
	if got.From != want.From || got.To != want.To || got.Samples != want.Samples || got.SMSamples != want.SMSamples ||
		got.MemoryMaxBytes != want.MemoryMaxBytes || got.MemoryMeanBytes != want.MemoryMeanBytes || got.SMMaxPercent != want.SMMaxPercent || got.SMMeanPercent != want.SMMeanPercent {
		t.Errorf("folded %+v\nwhole  %+v", got, want)
	}
	if got.MemoryP95Bytes < want.MemoryP95Bytes || float64(got.MemoryP95Bytes) > float64(want.MemoryP95Bytes)*1.01 || got.SMP95Percent != want.SMP95Percent {
		t.Errorf("p95 %d bytes and %d %% folded; %d and %d exact", got.MemoryP95Bytes, got.SMP95Percent, want.MemoryP95Bytes, want.SMP95Percent)
	}
	folded.Reset()
	if _, ok := folded.Summary(); ok {
		t.Error("Reset kept the folded samples")
	}
}

func TestDiffers(t *testing.T) {
	base := api.ShareUsage{MemoryMaxBytes: 10 << 30, MemoryP95Bytes: 8 << 30, SMP95Percent: 50, SMMeanPercent: 30}
	for _, tc := range []struct {
		name string
		edit func(*api.ShareUsage)
		want bool
	}{
		{"same", func(*api.ShareUsage) {}, false},
		{"peak up 5%", func(u *api.ShareUsage) { u.MemoryMaxBytes += 512 << 20 }, false},
		{"peak up 20%", func(u *api.ShareUsage) { u.MemoryMaxBytes += 2 << 30 }, true},
		{"p95 down 20%", func(u *api.ShareUsage) { u.MemoryP95Bytes -= 2 << 30 }, true},
		{"sm p95 +5", func(u *api.ShareUsage) { u.SMP95Percent += 5 }, false},
		{"sm mean +15", func(u *api.ShareUsage) { u.SMMeanPercent += 15 }, true},
	} {
		u := base
		tc.edit(&u)
		if got := Differs(u, base); got != tc.want {
			t.Errorf("%s: Differs = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Small shares move by at least a memory step before they are worth a write.
	small := api.ShareUsage{MemoryMaxBytes: 100 << 20}
	if Differs(api.ShareUsage{MemoryMaxBytes: 300 << 20}, small) {
		t.Error("a 200Mi move on a tiny share counted")
	}
}
