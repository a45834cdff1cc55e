package controller

import (
	"sort"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// gpuKey names a device: pool (fgpu's pool is the node name) and device.
type gpuKey struct{ pool, device string }

func (k gpuKey) String() string { return k.pool + "/" + k.device }

// gpu is one published device and the shares allocated on it.
type gpu struct {
	key       gpuKey
	node      string
	known     bool // published in a ResourceSlice (else only seen in allocations)
	memCap    int64
	compCap   int64
	attrs     map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	capacity  map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	taints    []resourceapi.DeviceTaint // those a claim must tolerate (not the fence, not None)
	usedMem   int64
	usedComp  int64
	tenants   map[types.UID]*tenant // by share ID
	coreNode  int
	sel       []selVerdict // CEL selector verdicts by interned selector (Controller.selectorRefs)
	selGen    int          // the interning generation sel belongs to
	coreIndex int
}

// tenant is one share of a GPU: what the co-tenancy rules need to know about it.
type tenant struct {
	claim      types.UID
	key        string // namespace/name
	namespace  string
	shareID    types.UID
	mem, comp  int64
	milli      int64
	whole      bool
	domain     string
	mode       api.SharingMode
	latency    api.LatencyClass
	maxCo      int
	allowCrit  bool
	maxTenants int
	allowShare bool
	byUs       bool
}

// claimRec is what the state holds for one allocated claim.
type claimRec struct {
	uid       types.UID
	key       string
	namespace string
	shares    []*tenantAt
	assumed   time.Time // zero once the informer confirmed it
}

type tenantAt struct {
	gpu *gpu
	t   *tenant
}

// state is the allocator's view of every fgpu GPU and every allocated fgpu claim.
// It is guarded by the controller's mutex.
type state struct {
	gpus map[gpuKey]*gpu
	// byPool indexes gpus by pool (node): a slice update touches its node's GPUs only,
	// not every GPU of the cluster (which made startup quadratic in nodes).
	byPool map[string]map[string]*gpu
	claims map[string]*claimRec
	// nsMem and nsComp are the allocated memory and compute per namespace (quota).
	nsMem, nsComp map[string]int64

	dirty   bool // the GPU set changed: rebuild the placement core
	core    *placement.Cluster
	coreGPU [][]*gpu
	refMem  int64
	scheds  map[api.LatencyClass]*placement.Scheduler
	seed    int64
}

type selVerdict int8

const (
	selUnknown selVerdict = iota
	selYes
	selNo
)

func newState() *state {
	return &state{gpus: map[gpuKey]*gpu{}, byPool: map[string]map[string]*gpu{}, claims: map[string]*claimRec{}, nsMem: map[string]int64{}, nsComp: map[string]int64{}, dirty: true}
}

func (s *state) gpuFor(k gpuKey) *gpu {
	g, ok := s.gpus[k]
	if !ok {
		g = &gpu{key: k, node: k.pool, tenants: map[types.UID]*tenant{}, compCap: 100}
		s.gpus[k] = g
		if s.byPool[k.pool] == nil {
			s.byPool[k.pool] = map[string]*gpu{}
		}
		s.byPool[k.pool][k.device] = g
	}
	return g
}

func (s *state) dropGPU(k gpuKey) {
	delete(s.gpus, k)
	if p := s.byPool[k.pool]; p != nil {
		delete(p, k.device)
		if len(p) == 0 {
			delete(s.byPool, k.pool)
		}
	}
}

// setNodeDevices replaces the devices a node publishes (from all of its slices).
func (s *state) setNodeDevices(node string, devs map[string]resourceapi.Device) {
	for name, g := range s.byPool[node] {
		if _, ok := devs[name]; !ok && g.known {
			g.known = false
			s.dirty = true
			if len(g.tenants) == 0 {
				s.dropGPU(g.key)
			}
		}
	}
	for name, d := range devs {
		g := s.gpuFor(gpuKey{node, name})
		memCap, compCap := int64(0), int64(100)
		if c, ok := d.Capacity[capMemory]; ok {
			memCap = c.Value.Value()
		}
		if c, ok := d.Capacity[capCompute]; ok {
			compCap = c.Value.Value()
		}
		if !g.known || g.memCap != memCap || g.compCap != compCap {
			s.dirty = true
		}
		g.known, g.memCap, g.compCap = true, memCap, compCap
		g.attrs, g.capacity = d.Attributes, d.Capacity
		g.taints = g.taints[:0]
		for _, t := range d.Taints {
			// The fence is the allocator's own; None taints only inform.
			if t.Key != FenceTaintKey && t.Effect != resourceapi.DeviceTaintEffectNone {
				g.taints = append(g.taints, t)
			}
		}
		g.sel = g.sel[:0] // new attributes: evaluate again
	}
}

// milliOf is a share in the placement core's units (1000 = one GPU), rounded down so the
// core never thinks a GPU fuller than it is; exact accounting is the controller's.
func milliOf(mem, memCap int64, whole bool) int64 {
	if whole || memCap <= 0 || mem >= memCap {
		return placement.DefaultGPUCapacity
	}
	m := mem * placement.DefaultGPUCapacity / memCap
	if m < 1 {
		m = 1
	}
	if m >= placement.DefaultGPUCapacity {
		m = placement.DefaultGPUCapacity - 1
	}
	return m
}

// add records a claim's shares (replacing what was recorded for it).
func (s *state) add(rec *claimRec) {
	if old, ok := s.claims[rec.key]; ok {
		s.remove(old.key)
	}
	s.claims[rec.key] = rec
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		g.tenants[t.shareID] = t
		g.usedMem += t.mem
		g.usedComp += t.comp
		t.milli = milliOf(t.mem, g.memCap, t.whole)
		s.coreAssign(g, t.milli, +1)
		s.nsMem[rec.namespace] += t.mem
		s.nsComp[rec.namespace] += t.comp
	}
}

// remove forgets a claim's shares.
func (s *state) remove(key string) *claimRec {
	rec, ok := s.claims[key]
	if !ok {
		return nil
	}
	delete(s.claims, key)
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		delete(g.tenants, t.shareID)
		g.usedMem -= t.mem
		g.usedComp -= t.comp
		s.coreAssign(g, t.milli, -1)
		s.nsMem[rec.namespace] -= t.mem
		s.nsComp[rec.namespace] -= t.comp
		if !g.known && len(g.tenants) == 0 {
			s.dropGPU(g.key)
		}
	}
	return rec
}

func (s *state) coreAssign(g *gpu, milli int64, sign int) {
	if s.dirty || s.core == nil || !g.known || g.coreNode < 0 || g.coreNode >= len(s.coreGPU) {
		return
	}
	if g.coreIndex >= len(s.coreGPU[g.coreNode]) || s.coreGPU[g.coreNode][g.coreIndex] != g {
		return
	}
	p := placement.Placement{Node: g.coreNode, GPUs: []int{g.coreIndex}, Share: []int64{milli}}
	free, _ := s.core.GPUs(g.coreNode)
	if sign > 0 {
		p.Share[0] = min(milli, free[g.coreIndex])
		_ = s.core.Assign(p, &placement.Request{})
	} else {
		_, capa := s.core.GPUs(g.coreNode)
		p.Share[0] = min(milli, capa[g.coreIndex]-free[g.coreIndex])
		_ = s.core.Release(p, &placement.Request{})
	}
}

// rebuild recreates the placement core from the known GPUs (the set of nodes or GPUs
// changed) and replays every share into it.
func (s *state) rebuild(policies func(api.LatencyClass) placement.Policy) error {
	byNode := map[string][]*gpu{}
	for _, g := range s.gpus {
		g.coreNode, g.coreIndex = -1, -1
		if g.known {
			byNode[g.node] = append(byNode[g.node], g)
		}
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	specs := make([]placement.NodeSpec, len(nodes))
	s.coreGPU = make([][]*gpu, len(nodes))
	memCount := map[int64]int{}
	for i, n := range nodes {
		gs := byNode[n]
		sort.Slice(gs, func(a, b int) bool { return gs[a].key.device < gs[b].key.device })
		specs[i] = placement.NodeSpec{Name: n, GPUs: make([]placement.GPUSpec, len(gs))}
		for j, g := range gs {
			g.coreNode, g.coreIndex = i, j
			specs[i].GPUs[j] = placement.GPUSpec{Model: modelOf(g)}
			memCount[g.memCap]++
		}
		s.coreGPU[i] = gs
	}
	// Requests are sized in the core against the most common GPU memory.
	s.refMem = 0
	best := 0
	for m, c := range memCount {
		if c > best || (c == best && m > s.refMem) {
			s.refMem, best = m, c
		}
	}
	c, err := placement.NewCluster(specs)
	if err != nil {
		return err
	}
	s.core = c
	s.dirty = false
	for _, g := range s.gpus {
		for _, t := range g.tenants {
			t.milli = milliOf(t.mem, g.memCap, t.whole)
			s.coreAssign(g, t.milli, +1)
		}
	}
	s.scheds = map[api.LatencyClass]*placement.Scheduler{}
	for _, l := range []api.LatencyClass{api.LatencyCritical, api.LatencyStandard, api.LatencyBestEffort} {
		s.seed++
		s.scheds[l] = placement.NewScheduler(c, policies(l), s.seed)
	}
	return nil
}

func modelOf(g *gpu) string {
	if a, ok := g.attrs["productName"]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}
