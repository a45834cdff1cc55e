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
