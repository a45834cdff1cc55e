package sim

import (
	"github.com/fgpu-dev/fgpu/pkg/binpack"
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

type gpuRef struct{ node, gpu int }

// fracLog remembers the fractional shares placed during a replay, for the
// repacking bound.
type fracLog struct {
	shares []int64
	gpus   map[gpuRef]int64 // capacity of each GPU holding a fractional pod
}

func newFracLog() *fracLog { return &fracLog{gpus: map[gpuRef]int64{}} }

func (l *fracLog) add(c *placement.Cluster, p placement.Placement) {
	_, capa := c.GPUs(p.Node)
	for i, g := range p.GPUs {
		if p.Share[i] < capa[g] {
			l.shares = append(l.shares, p.Share[i])
			l.gpus[gpuRef{p.Node, g}] = capa[g]
		}
	}
}

// waste reads the final cluster state, whose allocation ratio is alloc, with
// failed share units of demand turned away; it needs no record of releases
// because replays never release.
func (l *fracLog) waste(c *placement.Cluster, alloc float64, failed int64) Waste {
	var w Waste
	for n := range c.Len() {
		free, capa := c.GPUs(n)
		for g := range free {
			switch {
			case free[g] == capa[g]:
				w.WholeGPUs++
			case free[g] > 0:
				w.PartialGPUs += float64(free[g]) / float64(capa[g])
			}
		}
	}
	w.SharedGPUs = len(l.gpus)
	var capa int64
	for _, v := range l.gpus {
		if capa != 0 && v != capa {
			w.RepackGPUs = -1
			return w
		}
		capa = v
	}
	w.RepackGPUs = binpack.MinGPUs(l.shares, capa)
	total := float64(c.GPUCapacity())
	freed := float64(int64(w.SharedGPUs-w.RepackGPUs)*capa) / total
	w.RepackAlloc = alloc + min(freed, float64(failed)/total)
	return w
}
