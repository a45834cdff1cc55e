package placement

// A filtered request scores each candidate state once, unfiltered (filtered.go), and a
// small share fits on thousands of partly used states at 10,000 nodes: that scoring is
// the slowest decisions' time. For a stateScorer the outcome depends only on the state,
// the request's shape and the policy, and between two requests of one shape only the
// states of the few nodes that changed are new. So the outcomes are kept per shape and
// state, each valid while its state group holds the same state (groups carry a generation
// that a new state takes afresh) and the policy is the one it was scored by.

// scoreShape is what a state's unfiltered outcome depends on in a request.
type scoreShape struct {
	cpu, mem, share int64
	gpus            int
	mask            uint64
}

// stateScore is a state's unfiltered outcome for a shape.
type stateScore struct {
	gen, epoch uint64 // the group's generation and the policy's epoch it holds for (0: none)
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
	// maxScoreShapes bounds the shapes kept: about 40 bytes per state each.
	maxScoreShapes = 16
)

type stateScores struct {
	byShape map[scoreShape][]stateScore
	epoch   uint64
}

// forShape is the outcomes of shape k, by group id (grown to groups).
func (t *stateScores) forShape(k scoreShape, groups int) []stateScore {
	if t.byShape == nil {
		t.byShape = map[scoreShape][]stateScore{}
	}
	v, ok := t.byShape[k]
	if !ok && len(t.byShape) >= maxScoreShapes {
		clear(t.byShape)
	}
	if len(v) < groups {
		v = append(v, make([]stateScore, groups-len(v))...)
	}
	t.byShape[k] = v
	return v
}
