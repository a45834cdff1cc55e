package placement

import (
	"fmt"
	"math/bits"
)

// maxModels bounds the distinct GPU models so a model set fits a bit mask.
const maxModels = 64

type node struct {
	idx              int
	name             string
	cpuCap, memCap   int64
	cpuFree, memFree int64
	gpuCap           []int64
	gpuFree          []int64
	gpuModel         []uint8
	models           uint64 // union of the node's GPU models
	// loc holds each GPU's group per level of the node's wiring, nearest first
	// (topology.go); none where its specs group no GPUs.
	loc [][]int32
	// wiring numbers the node's wiring among the cluster's (0: none): it is part
	// of the node's state, as policies that see it pick GPUs by it.
	wiring uint32
}

// Cluster is the free capacity of every node. It is not safe for concurrent
// use; a controller serialises decisions (they depend on each other anyway).
type Cluster struct {
	nodes      []node
	modelID    map[string]uint8
	modelNames []string
	observers  []observer
	attaching  *Scheduler // the scheduler whose policy is attaching (owns new observers)
	gpuCap     int64      // total GPU capacity, share units
	gpuFree    int64
	states     stateIndex
	// tooLarge remembers whyNot's answer per request shape: it depends on
	// capacities only, which SetCapacity alone changes.
	tooLarge map[shapeOf]bool
	// scratch of the wiring choices (topology.go), sized to the largest node
	topoCount           []int
	topoIn              []bool
	topoCands, topoSame []int
}

// NewCluster builds the state of an empty cluster.
func NewCluster(specs []NodeSpec) (*Cluster, error) {
	c := &Cluster{modelID: map[string]uint8{}, nodes: make([]node, len(specs))}
	wirings := map[string]uint32{}
	var sig []byte
	for i, s := range specs {
		if s.CPUMilli < 0 || s.MemoryMiB < 0 {
			return nil, fmt.Errorf("node %q: negative capacity", s.Name)
		}
		n := node{idx: i, name: s.Name, cpuCap: s.CPUMilli, memCap: s.MemoryMiB, cpuFree: s.CPUMilli, memFree: s.MemoryMiB}
		n.gpuCap = make([]int64, len(s.GPUs))
		n.gpuFree = make([]int64, len(s.GPUs))
		n.gpuModel = make([]uint8, len(s.GPUs))
		for g, gs := range s.GPUs {
			capa := gs.Capacity
			if capa == 0 {
				capa = DefaultGPUCapacity
			}
			if capa < 0 {
				return nil, fmt.Errorf("node %q GPU %d: negative capacity", s.Name, g)
			}
			id, ok := c.modelID[gs.Model]
			if !ok {
				if len(c.modelNames) == maxModels {
					return nil, fmt.Errorf("more than %d GPU models", maxModels)
				}
				id = uint8(len(c.modelNames))
				c.modelID[gs.Model] = id
				c.modelNames = append(c.modelNames, gs.Model)
			}
			n.gpuCap[g], n.gpuFree[g], n.gpuModel[g] = capa, capa, id
			n.models |= 1 << id
			c.gpuCap += capa
		}
		if sig = n.wire(s.GPUs, sig); len(sig) > 0 {
			id, ok := wirings[string(sig)]
			if !ok {
				id = uint32(len(wirings) + 1)
				wirings[string(sig)] = id
			}
			n.wiring = id
		}
		if len(s.GPUs) > len(c.topoCount) {
			c.topoCount, c.topoIn = make([]int, len(s.GPUs)), make([]bool, len(s.GPUs))
		}
		c.nodes[i] = n
	}
	c.gpuFree = c.gpuCap
	c.indexStates()
	return c, nil
}

// Len is the number of nodes.
func (c *Cluster) Len() int { return len(c.nodes) }

// NodeName returns the name of node n.
func (c *Cluster) NodeName(n int) string { return c.nodes[n].name }

// GPUCapacity and GPUFree are cluster totals in share units.
func (c *Cluster) GPUCapacity() int64 { return c.gpuCap }

// GPUFree is the free GPU share of the whole cluster.
func (c *Cluster) GPUFree() int64 { return c.gpuFree }

// FreeCPU returns node n's free CPU (milli-cores) and memory (MiB).
func (c *Cluster) FreeCPU(n int) (cpu, mem int64) { return c.nodes[n].cpuFree, c.nodes[n].memFree }

// GPUs returns node n's free share and capacity per GPU. The slices are the
// cluster's own: read them, never write them.
func (c *Cluster) GPUs(n int) (free, capacity []int64) { return c.nodes[n].gpuFree, c.nodes[n].gpuCap }

// ModelName returns the name of a model id.
func (c *Cluster) ModelName(id uint8) string { return c.modelNames[id] }

type observer struct {
	owner *Scheduler
	f     func(n int)
}

// OnChange registers f to be called with the index of every node whose free
// capacity changes, so policies can refresh per-node caches incrementally.
// Hooks registered while a Scheduler attaches its policy belong to it, and go
// with the policy when Scheduler.SetPolicy replaces it.
func (c *Cluster) OnChange(f func(n int)) {
	c.observers = append(c.observers, observer{owner: c.attaching, f: f})
}

func (c *Cluster) changed(n int) {
	c.restate(n)
	for _, o := range c.observers {
		o.f(n)
	}
}

// SetCapacity sets node n's allocatable CPU (milli-cores) and memory (MiB),
// keeping what is used of them: a controller's nodes change their
// allocatable while claims run. Free capacity may go negative (then nothing
// fits there).
func (c *Cluster) SetCapacity(n int, cpuMilli, memoryMiB int64) {
	nd := &c.nodes[n]
	if nd.cpuCap == cpuMilli && nd.memCap == memoryMiB {
		return
	}
	nd.cpuFree += cpuMilli - nd.cpuCap
	nd.memFree += memoryMiB - nd.memCap
	nd.cpuCap, nd.memCap = cpuMilli, memoryMiB
	clear(c.tooLarge)
	c.changed(n)
}

// SetUsed sets how much of node n's CPU and memory is taken by what does not
// come through Assign (a controller's pods, bound or assumed); used is
// clamped to the node's capacity.
func (c *Cluster) SetUsed(n int, cpuMilli, memoryMiB int64) {
	nd := &c.nodes[n]
	cpu, mem := min(max(cpuMilli, 0), nd.cpuCap), min(max(memoryMiB, 0), nd.memCap)
	if nd.cpuCap-nd.cpuFree == cpu && nd.memCap-nd.memFree == mem {
		return
	}
	nd.cpuFree, nd.memFree = nd.cpuCap-cpu, nd.memCap-mem
	c.changed(n)
}

// modelMask resolves allowed model names to a mask; 0 with ok=true means any.
func (c *Cluster) modelMask(models []string) (mask uint64, ok bool) {
	if len(models) == 0 {
		return 0, true
	}
	for _, m := range models {
		if id, found := c.modelID[m]; found {
			mask |= 1 << id
		}
	}
	return mask, mask != 0
}

// Assign records a placement decided elsewhere (a claim already allocated)
// or by a Scheduler. It fails, changing nothing, if the node lacks room.
func (c *Cluster) Assign(p Placement, r *Request) error {
	if err := c.checkPlacement(p, r); err != nil {
		return err
	}
	n := &c.nodes[p.Node]
	for i, g := range p.GPUs {
		if n.gpuFree[g] < p.Share[i] {
			return fmt.Errorf("node %q GPU %d: %d free, %d asked", n.name, g, n.gpuFree[g], p.Share[i])
		}
	}
	if n.cpuFree < r.CPUMilli || n.memFree < r.MemoryMiB {
		return fmt.Errorf("node %q: not enough CPU or memory", n.name)
	}
	n.cpuFree -= r.CPUMilli
	n.memFree -= r.MemoryMiB
	for i, g := range p.GPUs {
		n.gpuFree[g] -= p.Share[i]
		c.gpuFree -= p.Share[i]
	}
	c.changed(p.Node)
	return nil
}

// Release returns a placement's resources (its claim was deleted).
func (c *Cluster) Release(p Placement, r *Request) error {
	if err := c.checkPlacement(p, r); err != nil {
		return err
	}
	n := &c.nodes[p.Node]
	for i, g := range p.GPUs {
		if n.gpuFree[g]+p.Share[i] > n.gpuCap[g] {
			return fmt.Errorf("node %q GPU %d: release exceeds capacity", n.name, g)
		}
	}
	if n.cpuFree+r.CPUMilli > n.cpuCap || n.memFree+r.MemoryMiB > n.memCap {
		return fmt.Errorf("node %q: release exceeds CPU or memory capacity", n.name)
	}
	n.cpuFree += r.CPUMilli
	n.memFree += r.MemoryMiB
	for i, g := range p.GPUs {
		n.gpuFree[g] += p.Share[i]
		c.gpuFree += p.Share[i]
	}
	c.changed(p.Node)
	return nil
}

func (c *Cluster) checkPlacement(p Placement, r *Request) error {
	if p.Node < 0 || p.Node >= len(c.nodes) {
		return fmt.Errorf("placement: node %d out of range", p.Node)
	}
	if len(p.GPUs) != len(p.Share) {
		return fmt.Errorf("placement: %d GPUs but %d shares", len(p.GPUs), len(p.Share))
	}
	if r.CPUMilli < 0 || r.MemoryMiB < 0 {
		return fmt.Errorf("placement: negative request")
	}
	n := &c.nodes[p.Node]
	var seen uint64
	for i, g := range p.GPUs {
		if g < 0 || g >= len(n.gpuFree) {
			return fmt.Errorf("placement: node %q has no GPU %d", n.name, g)
		}
		if g < 64 {
			if seen&(1<<g) != 0 {
				return fmt.Errorf("placement: GPU %d listed twice", g)
			}
			seen |= 1 << g
		}
		if p.Share[i] < 0 {
			return fmt.Errorf("placement: negative share")
		}
	}
	return nil
}

// fitsCPU reports whether node n has r's CPU and memory free.
func (n *node) fitsCPU(r *Request) bool {
	return n.cpuFree >= r.CPUMilli && n.memFree >= r.MemoryMiB
}

// usable reports whether GPU g of node ni can serve one GPU of request r.
func (c *Cluster) usable(ni, g int, r *Request, mask uint64) bool {
	return c.fits(ni, g, r, mask) && (r.Filter == nil || r.Filter(ni, g))
}

// fits reports whether GPU g of node ni has the model and the room for one GPU of r.
func (c *Cluster) fits(ni, g int, r *Request, mask uint64) bool {
	n := &c.nodes[ni]
	if mask != 0 && mask&(1<<n.gpuModel[g]) == 0 {
		return false
	}
	if r.Whole() || r.Share >= n.gpuCap[g] {
		if n.gpuFree[g] != n.gpuCap[g] {
			return false
		}
	} else if n.gpuFree[g] < r.Share {
		return false
	}
	return true
}

// take returns how much of GPU g a request uses.
func (c *Cluster) take(ni, g int, r *Request) int64 {
	capa := c.nodes[ni].gpuCap[g]
	if r.Whole() || r.Share >= capa {
		return capa
	}
	return r.Share
}

func popcount(m uint64) int { return bits.OnesCount64(m) }
