package sizing

import "time"

// Burst admission compares tenants' use in time, not their peaks: two tenants whose peaks
// never coincide can share a GPU whose memory is less than the sum of their peaks. Each
// share's (and each workload's) largest memory use is kept per report interval, on one clock
// for all of them, so that the intervals of tenants of one GPU line up.

// Clock cuts time into report intervals: interval k is [k·Width, (k+1)·Width) since the Unix
// epoch. Window is how many of the newest intervals are kept and compared.
type Clock struct {
	Width  time.Duration
	Window int
}

// Interval is the index of the interval that holds t.
func (c Clock) Interval(t time.Time) int64 {
	return t.UnixNano() / int64(c.Width)
}

// Maxima is one share's or one workload's largest memory use per interval, for the clock's
// window up to the newest interval recorded. The zero value is empty.
type Maxima struct {
	first int64   // the interval of vals[0]
	vals  []int64 // -1: nothing recorded for that interval
}

// Record takes a usage summary's peak for every interval its span [from, to] touches: a
// summary stands for its whole span (the plugin writes none while use stays steady, so a span
// can cover many intervals). Intervals older than the window before the newest are dropped.
func (m *Maxima) Record(c Clock, from, to time.Time, peak int64) {
	k0, k1 := c.Interval(from), c.Interval(to)
	// A span longer than the window keeps only the window's end.
	k0 = min(max(k0, k1-int64(c.Window)+1), k1)
	if len(m.vals) == 0 {
		m.first = k0
	}
	if k0 < m.first { // a span reaching back before what is kept: keep what fits the window
		grow := min(m.first-k0, int64(c.Window))
		m.vals = append(make([]int64, grow), m.vals...)
		for i := range grow {
			m.vals[i] = -1
		}
		m.first -= grow
		k0 = max(k0, m.first)
	}
	for int64(len(m.vals)) <= k1-m.first {
		m.vals = append(m.vals, -1)
	}
	for k := k0; k <= k1; k++ {
		m.vals[k-m.first] = max(m.vals[k-m.first], peak)
	}
	if drop := len(m.vals) - c.Window; drop > 0 {
		m.vals = append(m.vals[:0], m.vals[drop:]...)
		m.first += int64(drop)
	}
}

// At is the peak recorded for interval k, and whether one was.
func (m *Maxima) At(k int64) (int64, bool) {
	if m == nil || k < m.first || k-m.first >= int64(len(m.vals)) || m.vals[k-m.first] < 0 {
		return 0, false
	}
	return m.vals[k-m.first], true
}

// Peak is the largest value recorded in the window.
func (m *Maxima) Peak() int64 {
	var p int64
	if m != nil {
		for _, v := range m.vals {
			p = max(p, v)
		}
	}
	return p
}

// Newest is the newest interval recorded and its value; ok is false for an empty Maxima.
func (m *Maxima) Newest() (k, v int64, ok bool) {
	if m == nil || len(m.vals) == 0 {
		return 0, 0, false
	}
	return m.first + int64(len(m.vals)) - 1, m.vals[len(m.vals)-1], true
}

// Counted is how admission counts a tenant of a GPU in interval k: its share's record there;
// after the share's newest record, that record's value (the plugin writes nothing while use
// stays steady, until its heartbeat); before the share's first record, its workload's (the
// pods the workload ran as before); else all the tenant may use.
func Counted(share, workload *Maxima, all int64) func(k int64) int64 {
	return func(k int64) int64 {
		if v, ok := share.At(k); ok {
			return v
		}
		if newest, v, ok := share.Newest(); ok && k > newest {
			return v
		}
		if v, ok := workload.At(k); ok {
			return v
		}
		if newest, v, ok := workload.Newest(); ok && k > newest {
			return v
		}
		return all
	}
}

// Expected is how admission counts a newcomer in interval k: its workload's record there,
// or after the workload's newest record that record's value; unknown before the workload's
// first record, where its use says nothing.
func Expected(workload *Maxima) func(k int64) (int64, bool) {
	return func(k int64) (int64, bool) {
		if v, ok := workload.At(k); ok {
			return v, true
		}
		if newest, v, ok := workload.Newest(); ok && k > newest {
			return v, true
		}
		return 0, false
	}
}

// Known counts the intervals recorded.
func (m *Maxima) Known() int {
	n := 0
	if m != nil {
		for _, v := range m.vals {
			if v >= 0 {
				n++
			}
		}
	}
	return n
}

// Admit says whether a newcomer fits next to a GPU's tenants: at every interval of [from,
// to] where the newcomer's use is known (Expected), it plus each tenant's use (Counted)
// stays within limit. Where it does not, over is the first interval that does not fit and
// need what the tenants and the newcomer used together there.
func Admit(limit int64, from, to int64, newcomer func(k int64) (int64, bool), tenants []func(k int64) int64) (ok bool, over, need int64) {
	for k := from; k <= to; k++ {
		sum, known := newcomer(k)
		if !known {
			continue
		}
		for _, t := range tenants {
			sum += t(k)
		}
		if sum > limit {
			return false, k, sum
		}
	}
	return true, 0, 0
}
