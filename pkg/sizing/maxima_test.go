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
	if k, _ := m.Newest(); k != 14 || m.Peak() != 7 {
		t.Errorf("Newest %d, Peak %d; want 14, 7", k, m.Peak())
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
		t.Error("intervals where the newcomer recorded nothing were compared")
	}
}
