package model

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// The model mirrors its GPUs and shares into the placement core (pkg/placement), which
// scores where a claim goes; these keep the mirror in step.

// coreMirror is the placement core built over the model's GPUs, and what is learned for it.
type coreMirror struct {
	dirty   bool // the GPU set changed: rebuild the placement core
	core    *placement.Cluster
	coreGPU [][]*GPU
	coreIdx map[string]int // the core's node index by node name
	refMem  int64
	scheds  map[api.LatencyClass]*placement.Scheduler
	seed    int64

	// learn is the workload the standard class's policy measures against, learned from
	// the claims decided, as fgpu sim --learn learns it from the pods that arrive;
	// learned are the claims it has counted (a claim that waits is decided again).
	learn   *placement.Learner
	learned map[types.UID]struct{}

	// minMem and minComp are the smallest GPU's memory and compute: the least a whole GPU
	// takes of a quota before one is chosen.
	minMem, minComp int64
}

func newCoreMirror() coreMirror {
	return coreMirror{dirty: true, learn: placement.NewLearner(placement.DefaultWorkload(), placement.DefaultLearnOptions()),
		learned: map[types.UID]struct{}{}}
}

func (c *coreMirror) assign(g *GPU, milli int64, sign int) {
	if c.dirty || c.core == nil || !g.known || g.coreNode < 0 || g.coreNode >= len(c.coreGPU) {
		return
	}
	if g.coreIndex >= len(c.coreGPU[g.coreNode]) || c.coreGPU[g.coreNode][g.coreIndex] != g {
		return
	}
	p := placement.Placement{Node: g.coreNode, GPUs: []int{g.coreIndex}, Share: []int64{milli}}
	free, capa := c.core.GPUs(g.coreNode)
	if sign > 0 {
		p.Share[0] = min(milli, free[g.coreIndex])
		_ = c.core.Assign(p, &placement.Request{})
	} else {
		p.Share[0] = min(milli, capa[g.coreIndex]-free[g.coreIndex])
		_ = c.core.Release(p, &placement.Request{})
	}
}

// NodeSource is what the placement core needs of nodes besides their GPUs: each Node's
// allocatable CPU and memory, what its bound and assumed pods request, and which nodes
// changed in either since it last asked.
type NodeSource interface {
	Allocatable(node string) (cpuMilli, memMiB int64)
	Requested(node string) podfit.Requests
	ChangedNodes() []string
}

// PolicyFor builds the placement core's policy for a latency class and workload.
type PolicyFor func(api.LatencyClass, placement.Workload) placement.Policy

// ensureCore brings the placement core up to date: rebuilt when the set of nodes or GPUs
// changed, with every share replayed into it; otherwise the CPU and memory of the nodes
// that changed since. The core then holds what the simulator's does: per node its
// allocatable CPU and memory less what pods take, per GPU its free share. Caller holds mu.
func (m *Model) ensureCore(policies PolicyFor, nodes NodeSource) error {
	c := &m.core
	if !c.dirty && c.core != nil {
		for _, n := range nodes.ChangedNodes() {
			if i, ok := c.coreIdx[n]; ok {
				c.syncNode(i, n, nodes)
			}
		}
		return nil
	}
	byNode := map[string][]*GPU{}
	for _, g := range m.gpus {
		g.coreNode, g.coreIndex = -1, -1
		if g.known {
			byNode[g.node] = append(byNode[g.node], g)
		}
	}
	names := make([]string, 0, len(byNode))
	for n := range byNode {
		names = append(names, n)
	}
	sort.Strings(names)
	specs := make([]placement.NodeSpec, len(names))
	c.coreGPU = make([][]*GPU, len(names))
	c.coreIdx = make(map[string]int, len(names))
	memCount := map[int64]int{}
	c.minMem, c.minComp = 0, 0
	nodes.ChangedNodes() // all of them are read below
	for i, n := range names {
		gs := byNode[n]
		sort.Slice(gs, func(a, b int) bool { return gs[a].key.Device < gs[b].key.Device })
		cpu, mem := nodes.Allocatable(n)
		specs[i] = placement.NodeSpec{Name: n, CPUMilli: cpu, MemoryMiB: mem, GPUs: make([]placement.GPUSpec, len(gs))}
		c.coreIdx[n] = i
		for j, g := range gs {
			g.coreNode, g.coreIndex = i, j
			w := wiring(g.attrs)
			specs[i].GPUs[j] = placement.GPUSpec{Model: Product(g), Island: w[0], PCIeRoot: w[1], NUMA: w[2]}
			memCount[g.memCap]++
			first := i == 0 && j == 0
			if first || g.memCap < c.minMem {
				c.minMem = g.memCap
			}
			if first || g.compCap < c.minComp {
				c.minComp = g.compCap
			}
		}
		c.coreGPU[i] = gs
	}
	// Requests are sized in the core against the most common GPU memory.
	c.refMem = 0
	best := 0
	for mem, n := range memCount {
		if n > best || (n == best && mem > c.refMem) {
			c.refMem, best = mem, n
		}
	}
	core, err := placement.NewCluster(specs)
	if err != nil {
		return err
	}
	c.core = core
	c.dirty = false
	for i, n := range names {
		c.syncNode(i, n, nodes)
	}
	for _, g := range m.gpus {
		for _, t := range g.tenants {
			t.milli = MilliOf(t.Mem, g.memCap, t.Whole)
			c.assign(g, t.milli, +1)
		}
	}
	c.scheds = map[api.LatencyClass]*placement.Scheduler{}
	w := c.learn.Workload()
	for _, l := range []api.LatencyClass{api.LatencyCritical, api.LatencyStandard, api.LatencyBestEffort} {
		c.seed++
		c.scheds[l] = placement.NewScheduler(core, policies(l, w), c.seed)
	}
	return nil
}

// syncNode sets core node i's CPU and memory from its Node and its pods.
func (c *coreMirror) syncNode(i int, name string, nodes NodeSource) {
	cpu, mem := nodes.Allocatable(name)
	c.core.SetCapacity(i, cpu, mem)
	r := nodes.Requested(name)
	c.core.SetUsed(i, r.MilliCPU, MebibytesUp(r.Memory))
}

// observe counts a claim's request in the learned workload, once per claim, and hands the
// standard class's policy the new workload when the learner says so.
func (c *coreMirror) observe(uid types.UID, r *placement.Request, policies PolicyFor) {
	if _, ok := c.learned[uid]; ok {
		return
	}
	if len(c.learned) >= maxLearned {
		clear(c.learned) // a claim still waiting from before may count twice
	}
	c.learned[uid] = struct{}{}
	if c.learn.Observe(r) && c.core != nil {
		c.scheduler(api.LatencyStandard).SetPolicy(policies(api.LatencyStandard, c.learn.Workload()))
	}
}

// maxLearned bounds the claims remembered as counted by the learner.
const maxLearned = 1 << 17

// MebibytesUp is bytes in MiB, rounded up (a pod's memory in the core's unit).
func MebibytesUp(b int64) int64 { return (b + 1<<20 - 1) >> 20 }

// scheduler is the placement core's scheduler for a latency class.
func (c *coreMirror) scheduler(l api.LatencyClass) *placement.Scheduler {
	if s := c.scheds[l]; s != nil {
		return s
	}
	return c.scheds[api.LatencyStandard]
}

// Product is a GPU's product name ("" where it publishes none).
func Product(g *GPU) string {
	if a, ok := g.attrs[api.AttributeProductName]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// wiring is where a GPU sits on its node for the placement core, from its attributes:
// its NVLink island, PCIe root and NUMA node, "" where it has none. Only equality matters
// to the core, so the values keep their type prefix.
func wiring(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) [3]string {
	var w [3]string
	for i, name := range []resourceapi.QualifiedName{api.AttributeNVLinkIsland, api.AttributePCIeRoot, api.AttributeNUMANode} {
		if a, ok := attrs[name]; ok {
			w[i], _ = TypedValue(a)
		}
	}
	return w
}

// TypedValue is an attribute's value with its type, so that a string "1" and an integer 1
// differ; false for a value of no type fgpu compares.
func TypedValue(a resourceapi.DeviceAttribute) (string, bool) {
	switch {
	case a.StringValue != nil:
		return "string:" + *a.StringValue, true
	case a.IntValue != nil:
		return fmt.Sprintf("int:%d", *a.IntValue), true
	case a.BoolValue != nil:
		return fmt.Sprintf("bool:%t", *a.BoolValue), true
	case a.VersionValue != nil:
		return "version:" + *a.VersionValue, true
	}
	return "", false
}
