package sizing

import (
	"testing"
	"time"
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
	want := Usage{From: t0, To: t0.Add(990 * time.Second), Samples: 100,
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
	base := Usage{MemoryMaxBytes: 10 << 30, MemoryP95Bytes: 8 << 30, SMP95Percent: 50, SMMeanPercent: 30}
	for _, tc := range []struct {
		name string
		edit func(*Usage)
		want bool
	}{
		{"same", func(*Usage) {}, false},
		{"peak up 5%", func(u *Usage) { u.MemoryMaxBytes += 512 << 20 }, false},
		{"peak up 20%", func(u *Usage) { u.MemoryMaxBytes += 2 << 30 }, true},
		{"p95 down 20%", func(u *Usage) { u.MemoryP95Bytes -= 2 << 30 }, true},
		{"sm p95 +5", func(u *Usage) { u.SMP95Percent += 5 }, false},
		{"sm mean +15", func(u *Usage) { u.SMMeanPercent += 15 }, true},
	} {
		u := base
		tc.edit(&u)
		if got := u.Differs(base); got != tc.want {
			t.Errorf("%s: Differs = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Small shares move by at least a memory step before they are worth a write.
	small := Usage{MemoryMaxBytes: 100 << 20}
	if (Usage{MemoryMaxBytes: 300 << 20}).Differs(small) {
		t.Error("a 200Mi move on a tiny share counted")
	}
}
