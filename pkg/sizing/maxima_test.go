package sizing

import (
	"testing"
	"time"
)

func TestMaximaLinesUpIntervals(t *testing.T) {
	c := Clock{Width: 5 * time.Minute, Window: 4}
	at := func(k int64) time.Time { return time.Unix(0, k*int64(c.Width)) }
	var m Maxima
	m.Record(c, at(10), at(10).Add(time.Minute), 4)
	m.Record(c, at(10).Add(2*time.Minute), at(12), 7) // a span over three intervals: its peak stands for each
	for k, want := range map[int64]int64{10: 7, 11: 7, 12: 7} {
		if got, ok := m.At(k); !ok || got != want {
			t.Errorf("At(%d) = %d, %v; want %d", k, got, ok, want)
		}
	}
	if _, ok := m.At(9); ok {
		t.Error("an interval before the first summary is known")
	}
	m.Record(c, at(14), at(14), 3) // interval 13 stays unknown; 10 leaves the window
	if _, ok := m.At(13); ok {
		t.Error("an interval no summary touched is known")
	}
	if _, ok := m.At(10); ok {
		t.Error("an interval older than the window is kept")
	}
	if k, v, _ := m.Newest(); k != 14 || v != 3 || m.Peak() != 7 {
		t.Errorf("Newest %d = %d, Peak %d; want 14 = 3, 7", k, v, m.Peak())
	}
	// A span from long ago (or a zero time) keeps only the window's end.
	var long Maxima
	long.Record(c, time.Time{}, at(100), 5)
	if _, ok := long.At(96); ok || len(long.vals) != c.Window {
		t.Errorf("a span from the epoch kept %d intervals; want the window's %d", len(long.vals), c.Window)
	}
}

func TestCountedAndExpected(t *testing.T) {
	c := Clock{Width: time.Minute, Window: 100}
	at := func(k int64) time.Time { return time.Unix(0, k*int64(c.Width)) }
	var share, workload Maxima
	workload.Record(c, at(0), at(4), 20) // the pods the workload ran as before
	workload.Record(c, at(5), at(5), 9)
	share.Record(c, at(5), at(5), 9)
	counted := Counted(&share, &workload, 70)
	for k, want := range map[int64]int64{2: 20, 5: 9, 8: 9, -3: 70} {
		if got := counted(k); got != want {
			t.Errorf("counted(%d) = %d; want %d (workload's before the share, the newest after it, the cap where nothing is known)", k, got, want)
		}
	}
	if got := Counted(nil, &workload, 70)(9); got != 9 {
		t.Errorf("a share with no record after its workload's newest is counted at %d; want the newest 9", got)
	}
	expected := Expected(&workload)
	if v, ok := expected(5); !ok || v != 9 {
		t.Errorf("expected(5) = %d, %v; want 9", v, ok)
	}
	if v, ok := expected(9); !ok || v != 9 {
		t.Errorf("expected(9) = %d, %v; want the newest 9 carried forward", v, ok)
	}
	if _, ok := expected(-10); ok {
		t.Error("an interval before the workload ran is known")
	}
	if workload.Known() != 6 {
		t.Errorf("Known() = %d; want 6", workload.Known())
	}
}

func TestAdmitSumsInTime(t *testing.T) {
	// a peaks in interval 0, b in interval 1: together they need 6, not the 10 of their peaks.
	a := []int64{5, 1}
	b := []int64{1, 5}
	series := func(v []int64) func(int64) int64 { return func(k int64) int64 { return v[k] } }
	newcomer := func(k int64) (int64, bool) { return b[k], true }
	if ok, _, _ := Admit(6, 0, 1, newcomer, []func(int64) int64{series(a)}); !ok {
		t.Error("peaks that do not coincide were refused")
	}
	ok, over, need := Admit(6, 0, 1, newcomer, []func(int64) int64{series(a), series([]int64{0, 1})})
	if ok || over != 1 || need != 7 {
		t.Errorf("Admit = %v at %d needing %d; want refused at interval 1 needing 7", ok, over, need)
	}
	unknown := func(k int64) (int64, bool) { return 100, k == 5 }
	if ok, _, _ := Admit(6, 0, 1, unknown, []func(int64) int64{series(a)}); !ok {
		t.Error("intervals where the newcomer's use is unknown were compared")
	}
}
