package controller

import (
	"sort"

	resourceapi "k8s.io/api/resource/v1"

	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// The model mirrors its GPUs and shares into the placement core (pkg/placement), which
// scores where a claim goes; these keep the mirror in step.

func (m *model) coreAssign(g *gpu, milli int64, sign int) {
	if m.dirty || m.core == nil || !g.known || g.coreNode < 0 || g.coreNode >= len(m.coreGPU) {
		return
	}
	if g.coreIndex >= len(m.coreGPU[g.coreNode]) || m.coreGPU[g.coreNode][g.coreIndex] != g {
		return
	}
	p := placement.Placement{Node: g.coreNode, GPUs: []int{g.coreIndex}, Share: []int64{milli}}
	free, capa := m.core.GPUs(g.coreNode)
	if sign > 0 {
		p.Share[0] = min(milli, free[g.coreIndex])
		_ = m.core.Assign(p, &placement.Request{})
	} else {
		p.Share[0] = min(milli, capa[g.coreIndex]-free[g.coreIndex])
		_ = m.core.Release(p, &placement.Request{})
	}
}

// nodeSource is what the placement core needs of nodes besides their GPUs: each Node's
// allocatable CPU and memory, what its bound and assumed pods request, and which nodes
// changed in either since it last asked.
type nodeSource interface {
	allocatable(node string) (cpuMilli, memMiB int64)
	requested(node string) podfit.Requests
	changedNodes() []string
}

// policyFor builds the placement core's policy for a latency class and workload.
type policyFor func(api.LatencyClass, placement.Workload) placement.Policy

// ensureCore brings the placement core up to date: rebuilt when the set of nodes or GPUs
// changed, with every share replayed into it; otherwise the CPU and memory of the nodes
// that changed since. The core then holds what the simulator's does: per node its
// allocatable CPU and memory less what pods take, per GPU its free share. Caller holds mu.
func (m *model) ensureCore(policies policyFor, nodes nodeSource) error {
	if !m.dirty && m.core != nil {
		for _, n := range nodes.changedNodes() {
			if i, ok := m.coreIdx[n]; ok {
				m.syncNode(i, n, nodes)
			}
		}
		return nil
	}
	byNode := map[string][]*gpu{}
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
	m.coreGPU = make([][]*gpu, len(names))
	m.coreIdx = make(map[string]int, len(names))
	memCount := map[int64]int{}
	m.minMem, m.minComp = 0, 0
	nodes.changedNodes() // all of them are read below
	for i, n := range names {
		gs := byNode[n]
		sort.Slice(gs, func(a, b int) bool { return gs[a].key.device < gs[b].key.device })
		cpu, mem := nodes.allocatable(n)
		specs[i] = placement.NodeSpec{Name: n, CPUMilli: cpu, MemoryMiB: mem, GPUs: make([]placement.GPUSpec, len(gs))}
		m.coreIdx[n] = i
		for j, g := range gs {
			g.coreNode, g.coreIndex = i, j
			w := wiring(g.attrs)
			specs[i].GPUs[j] = placement.GPUSpec{Model: modelOf(g), Island: w[0], PCIeRoot: w[1], NUMA: w[2]}
			memCount[g.memCap]++
			first := i == 0 && j == 0
			if first || g.memCap < m.minMem {
				m.minMem = g.memCap
			}
			if first || g.compCap < m.minComp {
				m.minComp = g.compCap
			}
		}
		m.coreGPU[i] = gs
	}
	// Requests are sized in the core against the most common GPU memory.
	m.refMem = 0
	best := 0
	for mem, c := range memCount {
		if c > best || (c == best && mem > m.refMem) {
			m.refMem, best = mem, c
		}
	}
	c, err := placement.NewCluster(specs)
	if err != nil {
		return err
	}
	m.core = c
	m.dirty = false
	for i, n := range names {
		m.syncNode(i, n, nodes)
	}
	for _, g := range m.gpus {
		for _, t := range g.tenants {
			t.milli = milliOf(t.mem, g.memCap, t.whole)
			m.coreAssign(g, t.milli, +1)
		}
	}
	m.scheds = map[api.LatencyClass]*placement.Scheduler{}
	w := m.learn.Workload()
	for _, l := range []api.LatencyClass{api.LatencyCritical, api.LatencyStandard, api.LatencyBestEffort} {
		m.seed++
		m.scheds[l] = placement.NewScheduler(c, policies(l, w), m.seed)
	}
	return nil
}

// syncNode sets core node i's CPU and memory from its Node and its pods. Caller holds mu.
func (m *model) syncNode(i int, name string, nodes nodeSource) {
	cpu, mem := nodes.allocatable(name)
	m.core.SetCapacity(i, cpu, mem)
	r := nodes.requested(name)
	m.core.SetUsed(i, r.MilliCPU, mebibytesUp(r.Memory))
}

// observe counts a claim's request in the learned workload, once per claim, and hands the
// standard class's policy the new workload when the learner says so. Caller holds mu.
func (m *model) observe(uid types.UID, r *placement.Request, policies policyFor) {
	if _, ok := m.learned[uid]; ok {
		return
	}
	if len(m.learned) >= maxLearned {
		clear(m.learned) // a claim still waiting from before may count twice
	}
	m.learned[uid] = struct{}{}
	if m.learn.Observe(r) && m.core != nil {
		m.scheduler(api.LatencyStandard).SetPolicy(policies(api.LatencyStandard, m.learn.Workload()))
	}
}

// maxLearned bounds the claims remembered as counted by the learner.
const maxLearned = 1 << 17

// mebibytesUp is bytes in MiB, rounded up (a pod's memory in the core's unit).
func mebibytesUp(b int64) int64 { return (b + 1<<20 - 1) >> 20 }

// scheduler is the placement core's scheduler for a latency class.
func (m *model) scheduler(l api.LatencyClass) *placement.Scheduler {
	if s := m.scheds[l]; s != nil {
		return s
	}
	return m.scheds[api.LatencyStandard]
}

func modelOf(g *gpu) string {
	if a, ok := g.attrs[api.AttributeProductName]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// coreGPUAt is the GPU at the placement core's node ni, GPU gi; nil past the model's.
// Caller holds mu.
func (m *model) coreGPUAt(ni, gi int) *gpu {
	if ni < 0 || ni >= len(m.coreGPU) || gi < 0 || gi >= len(m.coreGPU[ni]) {
		return nil
	}
	return m.coreGPU[ni][gi]
}

// wiring is where a GPU sits on its node for the placement core, from its attributes:
// its NVLink island, PCIe root and NUMA node, "" where it has none. Only equality matters
// to the core, so the values keep their type prefix.
func wiring(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) [3]string {
	var w [3]string
	for i, name := range []resourceapi.QualifiedName{api.AttributeNVLinkIsland, api.AttributePCIeRoot, api.AttributeNUMANode} {
		if a, ok := attrs[name]; ok {
			w[i], _ = typedValue(a)
		}
	}
	return w
}
