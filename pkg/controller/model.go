package controller

import (
	"fmt"
	"maps"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
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
	coreIndex int
	// version changes with attrs and capacity: selector verdicts are kept per version;
	// keyText is key.String(), which they are kept by.
	version uint64
	keyText string
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
	domain     domain
	mode       api.SharingMode
	latency    api.LatencyClass
	maxCo      int
	allowCrit  bool
	maxTenants int
	allowShare bool
	byUs       bool
	// burstCap is the memory MPS lets a bursting share use, above mem (its guaranteed
	// part); 0 for a share that does not burst. workload is whose share it is, where the
	// allocator placed it since it started (zero after a restart).
	burstCap int64
	workload api.SizingWorkload
}

// claimRec is what the model holds for one allocated claim.
type claimRec struct {
	uid       types.UID
	key       string
	namespace string
	shares    []*tenantAt
	assumed   time.Time // when the allocator decided it; zero once the informer showed it
}

type tenantAt struct {
	gpu *gpu
	t   *tenant
}

// writeSettle is how long a claim the allocator decided on is trusted over an informer
// that does not show its allocation yet (the allocator's own write on its way back).
const writeSettle = 30 * time.Second

// model is the allocator's view of every fgpu GPU and every allocated fgpu claim, with the
// placement core built over it. Decisions hold mu from the first look at the model to the
// shares they reserve in it, so two decisions never hand out the same capacity; the
// selector and node-verdict memos are the decisions' and share that lock.
type model struct {
	mu     sync.Mutex
	driver string
	gpus   map[gpuKey]*gpu
	// byPool indexes gpus by pool (node): a slice update touches its node's GPUs only,
	// not every GPU of the cluster (which made startup quadratic in nodes).
	byPool map[string]map[string]*gpu
	claims map[string]*claimRec
	// nsMem and nsComp are the memory and compute charged to each namespace's quota
	// (tenant.charge).
	nsMem, nsComp map[string]int64
	// nsReserve is what the namespace's workloads scaled to zero keep of its quota.
	nsReserve map[string]usage
	// nsGPUs counts each namespace's tenants per GPU; heldMemo is each namespace's held room
	// (held.go) at generation gen, which every change to a GPU's tenants or size moves on.
	nsGPUs   map[string]map[*gpu]int
	heldMemo map[string]heldRoom
	gen      int

	dirty   bool // the GPU set changed: rebuild the placement core
	core    *placement.Cluster
	coreGPU [][]*gpu
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

	verdicts nodeVerdicts
	fit      fitMemo

	// versions numbers the GPUs' attribute versions; snap is the published GPUs that
	// selectors are evaluated on, rebuilt (with a new Gen) after any GPU's attributes
	// change or a GPU comes or goes (snapStale until then).
	versions  uint64
	snap      selectors.Snapshot
	snapStale bool
}

func newModel(driver string) *model {
	return &model{driver: driver, gpus: map[gpuKey]*gpu{}, byPool: map[string]map[string]*gpu{}, claims: map[string]*claimRec{},
		nsMem: map[string]int64{}, nsComp: map[string]int64{}, nsReserve: map[string]usage{}, dirty: true,
		nsGPUs: map[string]map[*gpu]int{}, heldMemo: map[string]heldRoom{},
		learn: placement.NewLearner(placement.DefaultWorkload(), placement.DefaultLearnOptions()), learned: map[types.UID]struct{}{},
		verdicts: nodeVerdicts{}}
}

// Account brings the model in line with a claim seen by the informer; it reports whether
// capacity was freed.
func (m *model) Account(claim *resourceapi.ResourceClaim, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := claimKey(claim)
	cur := m.claims[key]
	if claim.Status.Allocation == nil {
		if cur == nil {
			return false
		}
		if !cur.assumed.IsZero() && now.Sub(cur.assumed) < writeSettle {
			return false // our own write, not yet seen by the informer
		}
		m.remove(key)
		return true
	}
	rec := m.recordFromClaim(claim)
	if rec == nil {
		return false
	}
	if cur != nil && sameShares(cur, rec) {
		cur.assumed = time.Time{}
		return false
	}
	m.add(rec)
	return cur != nil
}

// Release forgets a claim's shares; it reports whether there were any.
func (m *model) Release(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.remove(key) != nil
}

// Rekey moves a claim's shares to another key (a deleted claim's, held while its pods
// run: goneClaims); it reports whether there were any.
func (m *model) Rekey(key, to string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec := m.claims[key]
	if rec == nil {
		return false
	}
	delete(m.claims, key)
	rec.key, rec.assumed = to, time.Time{}
	m.claims[to] = rec
	return true
}

// Written records that the allocator's allocation of a claim went out now: the informer
// has writeSettle to show it.
func (m *model) Written(key string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.claims[key]; cur != nil {
		cur.assumed = now
	}
}

// SetNodeDevices replaces the devices a node publishes (from all of its slices).
func (m *model) SetNodeDevices(node string, devs map[string]resourceapi.Device) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, g := range m.byPool[node] {
		if _, ok := devs[name]; !ok && g.known {
			g.known = false
			m.dirty, m.snapStale = true, true
			if len(g.tenants) == 0 {
				m.dropGPU(g.key)
			}
		}
	}
	for name, d := range devs {
		g := m.gpuFor(gpuKey{node, name})
		memCap, compCap := int64(0), int64(100)
		if c, ok := d.Capacity[api.CapacityMemory]; ok {
			memCap = c.Value.Value()
		}
		if c, ok := d.Capacity[api.CapacityCompute]; ok {
			compCap = c.Value.Value()
		}
		if !g.known || g.memCap != memCap || g.compCap != compCap {
			m.dirty = true
			m.gen++
		}
		if !g.known || !equality.Semantic.DeepEqual(g.attrs, d.Attributes) || !equality.Semantic.DeepEqual(g.capacity, d.Capacity) {
			m.versions++
			g.version, m.snapStale = m.versions, true
			// The placement core is built with each GPU's place on its node.
			if wiring(g.attrs) != wiring(d.Attributes) {
				m.dirty = true
			}
		}
		g.known, g.memCap, g.compCap = true, memCap, compCap
		g.attrs, g.capacity = d.Attributes, d.Capacity
		g.taints = g.taints[:0]
		for _, t := range d.Taints {
			// The fence is the allocator's own; None taints only inform.
			if t.Key != api.FenceTaintKey && t.Effect != resourceapi.DeviceTaintEffectNone {
				g.taints = append(g.taints, t)
			}
		}
	}
}

// SelectorSnapshot is the published GPUs as CEL selectors see them. Its Devices are shared
// and must not be changed.
func (m *model) SelectorSnapshot() selectors.Snapshot {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snapStale || m.snap.Gen == 0 {
		devs := make([]selectors.Device, 0, len(m.gpus))
		for _, g := range m.gpus {
			if g.known {
				devs = append(devs, selectors.Device{Key: g.keyText, Version: g.version, Attributes: g.attrs, Capacity: g.capacity})
			}
		}
		m.snap, m.snapStale = selectors.NewSnapshot(m.snap.Gen+1, devs), false
	}
	return m.snap
}

// decidedUnseen reports whether the model holds a decision on the claim that the informer has not
// shown yet (then the claim must not be decided twice). A decision the informer contradicts
// for longer than writeSettle is dropped. Caller holds mu.
func (m *model) decidedUnseen(key string, now time.Time) bool {
	rec := m.claims[key]
	if rec == nil {
		return false
	}
	if rec.assumed.IsZero() || now.Sub(rec.assumed) < writeSettle {
		return true
	}
	m.remove(key)
	return false
}

// EachGPU calls fn for every published GPU, under the model's lock.
func (m *model) EachGPU(fn func(g *gpu)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		if g.known {
			fn(g)
		}
	}
}

func (m *model) gpuFor(k gpuKey) *gpu {
	g, ok := m.gpus[k]
	if !ok {
		g = &gpu{key: k, keyText: k.String(), node: k.pool, tenants: map[types.UID]*tenant{}, compCap: 100}
		m.gpus[k] = g
		if m.byPool[k.pool] == nil {
			m.byPool[k.pool] = map[string]*gpu{}
		}
		m.byPool[k.pool][k.device] = g
	}
	return g
}

func (m *model) dropGPU(k gpuKey) {
	delete(m.gpus, k)
	m.snapStale = true
	if p := m.byPool[k.pool]; p != nil {
		delete(p, k.device)
		if len(p) == 0 {
			delete(m.byPool, k.pool)
		}
	}
}

// milliOf is a share in the placement core's units (1000 = one GPU), rounded down so the
// core never thinks a GPU fuller than it is; exact accounting is the controller's.
func milliOf(mem, memCap int64, whole bool) int64 {
	if whole || memCap <= 0 || mem >= memCap {
		return placement.DefaultGPUCapacity
	}
	return min(max(mem*placement.DefaultGPUCapacity/memCap, 1), placement.DefaultGPUCapacity-1)
}

// add records a claim's shares (replacing what was recorded for it). Caller holds mu.
func (m *model) add(rec *claimRec) {
	if old, ok := m.claims[rec.key]; ok {
		m.remove(old.key)
	}
	m.claims[rec.key] = rec
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		g.tenants[t.shareID] = t
		g.usedMem += t.mem
		g.usedComp += t.comp
		t.milli = milliOf(t.mem, g.memCap, t.whole)
		m.coreAssign(g, t.milli, +1)
		m.nsMem[rec.namespace] += t.charge()
		m.nsComp[rec.namespace] += t.comp
		if m.nsGPUs[rec.namespace] == nil {
			m.nsGPUs[rec.namespace] = map[*gpu]int{}
		}
		m.nsGPUs[rec.namespace][g]++
	}
	m.gen++
}

// remove forgets a claim's shares. Caller holds mu.
func (m *model) remove(key string) *claimRec {
	rec, ok := m.claims[key]
	if !ok {
		return nil
	}
	delete(m.claims, key)
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		delete(g.tenants, t.shareID)
		g.usedMem -= t.mem
		g.usedComp -= t.comp
		m.coreAssign(g, t.milli, -1)
		m.nsMem[rec.namespace] -= t.charge()
		m.nsComp[rec.namespace] -= t.comp
		if gs := m.nsGPUs[rec.namespace]; gs != nil {
			if gs[g]--; gs[g] <= 0 {
				delete(gs, g)
			}
			if len(gs) == 0 {
				delete(m.nsGPUs, rec.namespace)
				delete(m.heldMemo, rec.namespace)
			}
		}
		if !g.known && len(g.tenants) == 0 {
			m.dropGPU(g.key)
		}
	}
	m.gen++
	return rec
}

// recordFromClaim turns an allocated claim into the shares it holds. A share the allocator
// placed carries its Placement in the allocation (PlacedByAllocator), with the co-tenancy
// rules it keeps; others (kube-scheduler's, and an older allocator's without a Placement)
// get the standard class and no rules. Nothing
// is read from the claim's metadata, which its tenant can write. Caller holds mu.
func (m *model) recordFromClaim(claim *resourceapi.ResourceClaim) *claimRec {
	a := claim.Status.Allocation
	if a == nil {
		return nil
	}
	rec := &claimRec{uid: claim.UID, key: claimKey(claim), namespace: claim.Namespace}
	for i, r := range a.Devices.Results {
		if r.Driver != m.driver {
			continue
		}
		g := m.gpuFor(gpuKey{r.Pool, r.Device})
		cfg := allocationConfig(m.driver, a.Devices.Config, r.Request)
		t := &tenant{claim: claim.UID, key: rec.key, namespace: claim.Namespace, latency: api.LatencyStandard,
			mode: cfg.Mode, domain: domain{claim.Namespace, cfg.IsolationDomain}}
		t.byUs = api.FenceTolerated(r) // an older allocator's: the built-in rules
		if p := cfg.Placement; p != nil {
			t.byUs, t.maxCo, t.allowCrit, t.maxTenants, t.allowShare = true, int(p.MaxCoTenants), p.AllowCriticalCoTenants, int(p.MaxTenantsPerGPU), p.AllowSharedGPU
			if p.LatencyClass != "" {
				t.latency = p.LatencyClass
			}
			if p.MemoryLimit != nil {
				t.burstCap = p.MemoryLimit.Value()
			}
		}
		if r.ShareID != nil {
			t.shareID = *r.ShareID
		} else {
			t.shareID = types.UID(fmt.Sprintf("%s/%d", claim.UID, i))
		}
		if r.ConsumedCapacity == nil {
			t.whole, t.mem, t.comp = true, g.memCap, g.compCap
		} else {
			mem, comp := r.ConsumedCapacity[api.CapacityMemory], r.ConsumedCapacity[api.CapacityCompute]
			t.mem, t.comp = mem.Value(), comp.Value()
			t.whole = g.known && t.mem >= g.memCap
		}
		rec.shares = append(rec.shares, &tenantAt{gpu: g, t: t})
	}
	if len(rec.shares) == 0 {
		return nil
	}
	return rec
}

func sameShares(a, b *claimRec) bool {
	if len(a.shares) != len(b.shares) {
		return false
	}
	for i := range a.shares {
		if a.shares[i].t.shareID != b.shares[i].t.shareID || a.shares[i].gpu != b.shares[i].gpu || a.shares[i].t.mem != b.shares[i].t.mem {
			return false
		}
	}
	return true
}

// nsUse is one namespace's allocated claims and what they hold.
type nsUse struct {
	claims    int
	mem, comp int64
	// charged and chargedComp are what the quota counts: tenant.charge and compute, and the
	// room the namespace keeps from others (held.go).
	charged, chargedComp int64
}

// Reserves is a copy of what each namespace's workloads scaled to zero keep of its quota.
func (m *model) Reserves() map[string]usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.nsReserve)
}

// ByNamespace sums the allocated claims per namespace; namespaces without any are left out.
func (m *model) ByNamespace() map[string]nsUse {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]nsUse{}
	for _, rec := range m.claims {
		u := out[rec.namespace]
		u.claims++
		for _, sh := range rec.shares {
			u.mem += sh.t.mem
			u.charged += sh.t.charge()
			u.comp += sh.t.comp
		}
		out[rec.namespace] = u
	}
	for ns, u := range out {
		h := m.held(ns).charge()
		u.charged, u.chargedComp = u.charged+h.mem, u.comp+h.comp
		out[ns] = u
	}
	return out
}
