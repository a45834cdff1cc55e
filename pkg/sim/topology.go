package sim

import (
	"strconv"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Topology is how a node's GPUs are wired, as blocks of consecutive
// node-local GPU indices: GPU g lies in NVLink island g/IslandSize and in
// PCIe root g/RootSize. The openb trace names no wiring, so this is a model
// (openbTopologies). A replay gives it to the policy in the nodes' specs
// (wire), unless Config.TopologyBlind, and measures against it how local the
// multi-GPU pods' GPUs are (Locality).
type Topology struct {
	// IslandSize is the GPUs per NVLink island: GPUs that reach each other
	// over NVLink. 0 on PCIe-only nodes.
	IslandSize int
	// RootSize is the GPUs per PCIe root complex (CPU socket): GPUs under
	// one root reach each other without crossing the inter-socket link.
	// 0 when the node's wiring is unknown.
	RootSize int
}

type nodeShape struct {
	model string
	gpus  int
}

// openbTopologies is the wiring assumed for each GPU node shape of the
// openb node list; docs/placement.md ("Topology") says why.
var openbTopologies = map[nodeShape]Topology{
	// V100 SXM2 boards as DGX-1: two quads, each fully connected by NVLink
	// and under one CPU socket. The hybrid cube-mesh's single links between
	// the quads are left out, as is usual. A 4-GPU node is one quad.
	{"V100M16", 8}: {IslandSize: 4, RootSize: 4},
	{"V100M32", 8}: {IslandSize: 4, RootSize: 4},
	{"V100M16", 4}: {IslandSize: 4, RootSize: 4},
	{"V100M32", 4}: {IslandSize: 4, RootSize: 4},
	// Alibaba's unnamed models, on 8-GPU training-sized hosts: wired like
	// the V100 nodes. An all-8 NVSwitch island would make every pod on them
	// local by construction, hiding what the baseline is for.
	{"G2", 8}: {IslandSize: 4, RootSize: 4},
	{"G3", 8}: {IslandSize: 4, RootSize: 4},
	// PCIe cards without NVLink: two per socket on a 4-GPU host, both under
	// one socket on a 2-GPU host.
	{"T4", 4}:   {RootSize: 2},
	{"T4", 2}:   {RootSize: 2},
	{"P100", 2}: {RootSize: 2},
	// One GPU: nothing to be local to.
	{"A10", 1}:     {RootSize: 1},
	{"P100", 1}:    {RootSize: 1},
	{"V100M16", 1}: {RootSize: 1},
}

// topologyOf is node n's wiring in the openb model; the zero Topology for
// a shape the model does not know (or mixed models).
func topologyOf(n placement.NodeSpec) Topology {
	if len(n.GPUs) == 0 {
		return Topology{}
	}
	for _, g := range n.GPUs[1:] {
		if g.Model != n.GPUs[0].Model {
			return Topology{}
		}
	}
	return openbTopologies[nodeShape{n.GPUs[0].Model, len(n.GPUs)}]
}

// wire returns the nodes as the policy sees them: those whose specs name no
// wiring get the model's, each PCIe root its own NUMA node (a socket's root
// complex); blind, no node's specs name any.
func wire(nodes []placement.NodeSpec, blind bool) []placement.NodeSpec {
	out := make([]placement.NodeSpec, len(nodes))
	for i, n := range nodes {
		out[i] = n
		t := topologyOf(n)
		if !blind && (t == Topology{} || named(n)) {
			continue
		}
		out[i].GPUs = append([]placement.GPUSpec(nil), n.GPUs...)
		for g := range out[i].GPUs {
			gs := &out[i].GPUs[g]
			gs.Island, gs.PCIeRoot, gs.NUMA = "", "", ""
			if blind {
				continue
			}
			if t.IslandSize > 0 {
				gs.Island = strconv.Itoa(g / t.IslandSize)
			}
			if t.RootSize > 0 {
				gs.PCIeRoot = strconv.Itoa(g / t.RootSize)
				gs.NUMA = gs.PCIeRoot
			}
		}
	}
	return out
}

// named reports whether some GPU of n has its wiring named in its spec.
func named(n placement.NodeSpec) bool {
	for _, g := range n.GPUs {
		if g.Island != "" || g.PCIeRoot != "" || g.NUMA != "" {
			return true
		}
	}
	return false
}

// Locality counts the placed multi-GPU pods by where their GPUs lie. A pod
// had room in an island (a root) when one island (root) of its node had as
// many usable GPUs as it took, its own GPUs counted free: there, choosing
// other GPUs of the same node would have kept it local. Batch replays judge
// room after the whole batch is assigned.
type Locality struct {
	Pods       int // multi-GPU pods placed
	IslandRoom int // of those, with room in one NVLink island
	InIsland   int // of those, with their GPUs in one island
	RootRoom   int // of the pods, with room under one PCIe root
	InRoot     int // of those, with their GPUs under one root
}

// add counts placement p on a node wired as t whose GPUs have free share
// left after p was assigned; single-GPU placements are not counted.
func (l *Locality) add(t Topology, p placement.Placement, free []int64) {
	if len(p.GPUs) < 2 {
		return
	}
	l.Pods++
	usable := make([]bool, len(free))
	for g := range free {
		usable[g] = free[g] >= p.Share[0]
	}
	for _, g := range p.GPUs {
		usable[g] = true
	}
	if hasRoom(t.IslandSize, len(p.GPUs), usable) {
		l.IslandRoom++
		if within(t.IslandSize, p.GPUs) {
			l.InIsland++
		}
	}
	if hasRoom(t.RootSize, len(p.GPUs), usable) {
		l.RootRoom++
		if within(t.RootSize, p.GPUs) {
			l.InRoot++
		}
	}
}

// hasRoom reports whether one block of size consecutive GPUs holds n
// usable ones.
func hasRoom(size, n int, usable []bool) bool {
	if size < n {
		return false
	}
	for start := 0; start < len(usable); start += size {
		k := 0
		for _, u := range usable[start:min(start+size, len(usable))] {
			if u {
				k++
			}
		}
		if k >= n {
			return true
		}
	}
	return false
}

// within reports whether gpus all lie in one block of size consecutive GPUs.
func within(size int, gpus []int) bool {
	if size == 0 {
		return false
	}
	for _, g := range gpus {
		if g/size != gpus[0]/size {
			return false
		}
	}
	return true
}
