package placement

// A filtered request scores each candidate state once, unfiltered (filtered.go), and a
// small share fits on thousands of partly used states at 10,000 nodes: that scoring is
// the slowest decisions' time. For a stateScorer the outcome depends only on the state,
// the request's shape and the policy, and between two requests of one shape only the
// states of the few nodes that changed are new. So the outcomes are kept per shape and
// state, each valid while its state group holds the same state (groups carry a generation
// that a new state takes afresh) and its shape's slot holds the stamp it was scored under
// (a slot takes a new stamp when it passes to another shape or the policy is replaced).

// scoreShape is what a state's unfiltered outcome depends on in a request.
type scoreShape struct {
	cpu, mem, share int64
	gpus            int
	mask            uint64
}

// stateScore is a state's unfiltered outcome for a shape.
type stateScore struct {
	gen, stamp uint64 // the group's generation and the slot's stamp it holds for
	kind       int8   // outcome: outSkip, outShort or outCand
	bounded    bool
	ngpus      uint8
	n          int32 // usable GPUs
	score      float64
	gpus       [maxKeptGPUs]int8
}

const (
	outSkip int8 = iota
	outShort
	outCand
)

const (
	// maxKeptGPUs bounds the GPUs an outcome keeps (larger picks are scored afresh).
	maxKeptGPUs = 8
	// maxScoreShapes bounds the shapes kept, 40 bytes per state each (30 MiB at 10,917
	// nodes); the least recently asked shape gives its slot to a new one. A trace's small
	// shares recur a hundred requests or more apart, among as many other shapes (openb's
	// default has 126): 16 slots let them go before they came back.
	maxScoreShapes = 128
)

type shapeSlot struct {
	shape  scoreShape
	stamp  uint64
	epoch  uint64 // the policy epoch stamp was given under
	used   uint64
	scores []stateScore
}

type stateScores struct {
	slots  []shapeSlot
	epoch  uint64 // moves with each policy attached
	stamps uint64 // the last stamp given
	clock  uint64
}

// forShape is the outcomes of shape k, by group id (grown to groups), and the stamp the
// valid ones carry.
func (t *stateScores) forShape(k scoreShape, groups int) ([]stateScore, uint64) {
	t.clock++
	var sl *shapeSlot
	for i := range t.slots {
		if t.slots[i].shape == k {
			sl = &t.slots[i]
			break
		}
	}
	if sl == nil {
		if len(t.slots) < maxScoreShapes {
			t.slots = append(t.slots, shapeSlot{})
			sl = &t.slots[len(t.slots)-1]
		} else {
			sl = &t.slots[0]
			for i := range t.slots {
				if t.slots[i].used < sl.used {
					sl = &t.slots[i]
				}
			}
		}
		sl.shape, sl.stamp = k, 0
	}
	if sl.stamp == 0 || sl.epoch != t.epoch {
		t.stamps++
		sl.stamp, sl.epoch = t.stamps, t.epoch
	}
	if len(sl.scores) < groups {
		sl.scores = append(sl.scores, make([]stateScore, groups-len(sl.scores))...)
	}
	sl.used = t.clock
	return sl.scores, sl.stamp
}
