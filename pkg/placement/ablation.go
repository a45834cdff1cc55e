package placement

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// Ablations are the variants of fgpu's policy that docs/placement.md
// measures ("Knobs" lists each with its figures). The zero value is the
// shipped policy; none of them is shipped. fgpu sim --knobs sets them by
// name.
type Ablations struct {
	// How a fragmentation decrease becomes a score.

	// NoSigmoid compares exact decreases (rounded to 1/1000 share unit)
	// instead of FGD's coarse 0..100 scale.
	NoSigmoid bool
	// Scale divides the decrease before the sigmoid (0 = 1000, FGD's);
	// ScaleFrac, when positive, replaces it for requests that share a GPU.
	Scale, ScaleFrac float64
	// Levels is the number of steps of the sigmoid score (0 = 100, FGD's).
	Levels float64
	// SigRound rounds the sigmoid score instead of truncating it.
	SigRound bool
	// Resolution, when positive, compares decreases rounded to this many
	// share units instead.
	Resolution float64

	// How equal scores are broken (the shipped policy: by node name).

	// Random breaks them at random.
	Random bool
	// TieOrder ranks nodes by a fixed order, then by name; it takes
	// precedence over Resolution and TieLeft.
	TieOrder TieOrder
	// TieLeft breaks equal decreases by what the node has left.
	TieLeft TieLeft
	// TieType breaks them by the exact decrease (through TieBreaker).
	TieType TieType
	// TieWhole breaks them towards the node left with the fewest fully free
	// GPUs.
	TieWhole TieWhole

	// What the fragmentation measures.

	// DemandWeighted weights shapes by count x GPU demand instead of count.
	DemandWeighted bool
	// MultiBoost, when positive, multiplies the weight of multi-GPU shapes.
	MultiBoost float64
	// NoCPUReach turns CPU reach off: FGD's measure.
	NoCPUReach bool
	// ReachGuard leaves CPU reach out on nodes that can still host a
	// multi-GPU shape.
	ReachGuard ReachGuard
	// MixSplit, when positive, gives sharing shapes with a per-GPU share
	// below it the MixReach fraction MixReachLo, and the others MixReachHi,
	// instead of Options.MixReach.
	MixSplit               int64
	MixReachLo, MixReachHi float64

	// The LP packing loss (with Options.PackPrice > 0).

	// NoPackNode charges only requests that share a GPU, with the loss of
	// the one gap they go in, instead of every request with what the whole
	// node's gaps lose.
	NoPackNode bool
	// NoPackCPU, with NoPackNode, values a gap with every share instead of
	// only those whose pods' CPU the node has free.
	NoPackCPU bool

	// Keeping hosts for multi-GPU shapes (reserve.go).

	// Reserve, when positive, penalises a placement that stops a node
	// hosting a multi-GPU shape (enough fully free GPUs and free CPU) while
	// the nodes that can host it number at most Reserve x the pods of it
	// expected as the cluster's free GPU share fills: below the score's
	// resolution (ties only) or, with ReserveAbove, above it.
	Reserve      float64
	ReserveAbove bool
	// ReserveRatio, when positive, takes ReserveRatio points off the score
	// for each multi-GPU shape a placement stops a node hosting, times that
	// shape's expected pods per node that can host it now (at most 1 per
	// shape); no threshold.
	ReserveRatio float64
}

// TieOrder is a fixed node order for equal scores.
type TieOrder uint8

const (
	TieByName        TieOrder = iota // node name only
	TieGPUsAsc                       // fewest GPUs first
	TieGPUsDesc                      // most GPUs first
	TieCPUPerGPUAsc                  // least CPU per GPU first
	TieCPUPerGPUDesc                 // most CPU per GPU first
)

var tieOrderNames = []string{"name", "gpus-asc", "gpus-desc", "cpu-per-gpu-asc", "cpu-per-gpu-desc"}

func (t TieOrder) String() string                { return enumName(tieOrderNames, t) }
func (t *TieOrder) UnmarshalText(b []byte) error { return setEnum(t, tieOrderNames, b) }

// TieLeft breaks equal decreases by what the node has left after the
// placement.
type TieLeft uint8

const (
	TieLeftNone TieLeft = iota
	// TieLeftFullest prefers the node left with the least free GPU share
	// and CPU, each as a fraction of the node's.
	TieLeftFullest
	// TieLeftFreeCPU prefers the node left with the most free CPU.
	TieLeftFreeCPU
)

var tieLeftNames = []string{"none", "fullest", "free-cpu"}

func (t TieLeft) String() string                { return enumName(tieLeftNames, t) }
func (t *TieLeft) UnmarshalText(b []byte) error { return setEnum(t, tieLeftNames, b) }

// TieType breaks equal scores by the exact fragmentation decrease.
type TieType uint8

const (
	TieTypeNone TieType = iota
	// TieTypeSame compares only nodes of the same type (CPU, GPU count and
	// models) as the best so far; name order decides otherwise.
	TieTypeSame
	// TieTypeAny compares any nodes.
	TieTypeAny
)

var tieTypeNames = []string{"none", "same-type", "any"}

func (t TieType) String() string                { return enumName(tieTypeNames, t) }
func (t *TieType) UnmarshalText(b []byte) error { return setEnum(t, tieTypeNames, b) }

// TieWhole says which requests break equal scores towards the node left
// with the fewest fully free GPUs.
type TieWhole uint8

const (
	TieWholeNone   TieWhole = iota
	TieWholeAll             // every request
	TieWholeWhole           // requests that take whole GPUs
	TieWholeShared          // requests that do not (sharing and CPU-only)
)

var tieWholeNames = []string{"none", "all", "whole", "shared"}

func (t TieWhole) String() string                { return enumName(tieWholeNames, t) }
func (t *TieWhole) UnmarshalText(b []byte) error { return setEnum(t, tieWholeNames, b) }

// ReachGuard says which multi-GPU shapes keep FGD's measure (no CPU reach)
// on the nodes that can still host them.
type ReachGuard uint8

const (
	ReachGuardNone    ReachGuard = iota
	ReachGuardLargest            // the workload's largest, by GPUs
	ReachGuardAny                // any of them
)

var reachGuardNames = []string{"none", "largest", "any"}

func (g ReachGuard) String() string                { return enumName(reachGuardNames, g) }
func (g *ReachGuard) UnmarshalText(b []byte) error { return setEnum(g, reachGuardNames, b) }

func enumName[T ~uint8](names []string, v T) string {
	if int(v) < len(names) {
		return names[v]
	}
	return fmt.Sprintf("%d", v)
}

func setEnum[T ~uint8](v *T, names []string, text []byte) error {
	i := slices.Index(names, string(text))
	if i < 0 {
		return fmt.Errorf("%q is not one of %s", text, strings.Join(names, ", "))
	}
	*v = T(i)
	return nil
}

// workload is the shape distribution the fragmentation and the LP loss
// measure against.
func (a *Ablations) workload(w Workload) Workload {
	if a.DemandWeighted {
		w = demandWeighted(w)
	}
	if a.MultiBoost > 0 {
		w = append(Workload(nil), w...)
		for i := range w {
			if w[i].GPUs >= 2 {
				w[i].Weight *= a.MultiBoost
			}
		}
	}
	return w
}

// mixTheta is MixReach's fraction: theta, or with MixSplit the larger of
// the two per-shape fractions (it gates the relaxation).
func (a *Ablations) mixTheta(theta float64) float64 {
	if a.MixSplit > 0 {
		return max(a.MixReachLo, a.MixReachHi)
	}
	return theta
}

// splitMix gives each shape of fm its own MixReach fraction (MixSplit).
func (a *Ablations) splitMix(fm *fragModel) {
	if a.MixSplit <= 0 {
		return
	}
	fm.perShape = true
	for i := range fm.shapes {
		sh := &fm.shapes[i]
		sh.theta = a.MixReachHi
		if sh.share > 0 && sh.share < a.MixSplit {
			sh.theta = a.MixReachLo
		}
	}
}

// sigmoidScale is the sigmoid's scale for request r (whole: it takes whole
// GPUs).
func (a *Ablations) sigmoidScale(r *Request, whole bool) float64 {
	scale := a.Scale
	if r.GPUs > 0 && !whole && a.ScaleFrac > 0 {
		scale = a.ScaleFrac
	}
	if scale == 0 {
		return 1000
	}
	return scale
}

// attachAblations builds the ablations' per-cluster state.
func (f *FGPU) attachAblations(c *Cluster) {
	f.group = nil
	if f.ab.TieType == TieTypeSame {
		type key struct {
			cpu    int64
			gpus   int
			models uint64
		}
		ids := map[key]int{}
		f.group = make([]int, c.Len())
		for n := range f.group {
			nd := &c.nodes[n]
			k := key{nd.cpuCap, len(nd.gpuCap), nd.models}
			id, ok := ids[k]
			if !ok {
				id = len(ids)
				ids[k] = id
			}
			f.group[n] = id
		}
	}
	f.res = nil
	if f.ab.Reserve > 0 || f.ab.ReserveRatio > 0 {
		f.res = newReserve(c, f.w, f.ab.Reserve)
	}
	f.rank = nil
	if f.ab.TieOrder != TieByName {
		f.rank = make([]float64, c.Len())
		for n := range f.rank {
			nd := &c.nodes[n]
			g := float64(len(nd.gpuCap))
			var r float64
			switch f.ab.TieOrder {
			case TieGPUsAsc:
				r = -g
			case TieGPUsDesc:
				r = g
			case TieCPUPerGPUAsc:
				r = -float64(nd.cpuCap) / max(g, 1) / 1000
			case TieCPUPerGPUDesc:
				r = float64(nd.cpuCap) / max(g, 1) / 1000
			}
			// then by index (name order)
			f.rank[n] = r*1e4 - float64(n)
		}
	}
}

// Tie implements TieBreaker for TieType: the last scored node's group and
// exact fragmentation decrease.
func (f *FGPU) Tie(n int) (int, float64, bool) {
	switch f.ab.TieType {
	case TieTypeSame:
		return f.group[n], f.lastDec, true
	case TieTypeAny:
		return 0, f.lastDec, true
	}
	return 0, 0, false
}

// ablatedFinal is final with the score and tie ablations: the decrease on
// the chosen scale, and TieOrder's or TieLeft's tie-break folded in below
// its resolution. f.tmp holds the node's free GPU shares for TieLeft.
func (f *FGPU) ablatedFinal(nd *node, decrease float64, cpuAfter int64) float64 {
	a := &f.ab
	primary := math.Round(decrease*1000) / 1000
	if !a.NoSigmoid {
		levels := a.Levels
		if levels == 0 {
			levels = 100
		}
		primary = levels / (1 + math.Exp(-decrease/f.scale))
		if a.SigRound {
			primary = math.Round(primary)
		} else {
			primary = math.Trunc(primary)
		}
	}
	if f.rank != nil {
		return primary*1e9 + f.rank[nd.idx]
	}
	if a.Resolution > 0 {
		primary = math.Round(decrease / a.Resolution)
	}
	switch a.TieLeft {
	case TieLeftFreeCPU:
		cpuLeft := 0.0
		if nd.cpuCap > 0 {
			cpuLeft = float64(cpuAfter) / float64(nd.cpuCap)
		}
		return primary + 1e-4*cpuLeft
	case TieLeftFullest:
		var free, capa int64
		for g, v := range f.tmp {
			free += v
			capa += nd.gpuCap[g]
		}
		left := 0.0
		if capa > 0 {
			left += float64(free) / float64(capa)
		}
		if nd.cpuCap > 0 {
			left += float64(cpuAfter) / float64(nd.cpuCap)
		}
		return primary + 1e-4*(1-left/2)
	}
	return primary
}

// adjust applies TieWhole and the Reserve penalties to a score, with f.tmp
// holding the node's free GPU shares after the placement. The shipped
// policy's scores pass unchanged.
func (f *FGPU) adjust(nd *node, score float64, cpuAfter int64) float64 {
	a := &f.ab
	if a.TieWhole == TieWholeAll || (a.TieWhole == TieWholeWhole && f.whole) || (a.TieWhole == TieWholeShared && !f.whole) {
		w := 0
		for g, v := range f.tmp {
			if v == nd.gpuCap[g] {
				w++
			}
		}
		score -= 1e-3 * float64(w)
	}
	if f.res == nil {
		return score
	}
	if a.ReserveRatio > 0 {
		return score - a.ReserveRatio*f.res.lostNeed(nd, cpuAfter, f.tmp)
	}
	b := f.res.broken(nd, cpuAfter, f.tmp)
	switch {
	case b == 0:
		return score
	case a.ReserveAbove:
		return score - 1000*float64(b)
	}
	return score - 0.9*(1-1/float64(1+b))
}

// demandWeighted reweights shapes by their GPU demand (CPU-only shapes keep
// the weight of a tenth of a GPU so they still count).
func demandWeighted(w Workload) Workload {
	out := make(Workload, len(w))
	var sum float64
	for i, s := range w {
		d := 0.1
		if s.GPUs > 0 {
			d = float64(s.GPUs) * float64(s.Share) / DefaultGPUCapacity
		}
		out[i] = s
		out[i].Weight = s.Weight * d
		sum += out[i].Weight
	}
	for i := range out {
		out[i].Weight /= sum
	}
	return out
}
