package model

import (
	"fmt"
	"maps"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
)

// WriteSettle is how long a claim the allocator decided on is trusted over an informer
// that does not show its allocation yet (the allocator's own write on its way back).
const WriteSettle = 30 * time.Second

// Model is the allocator's view of every fgpu GPU and every allocated fgpu claim, with the
// placement core built over it. Its methods take its lock; a decision holds it through
// Update from the first look at the model to the shares it reserves in it.
type Model struct {
	mu     sync.Mutex
	driver string
	gpus   map[GPUKey]*GPU
	// byPool indexes gpus by pool (node): a slice update touches its node's GPUs only,
	// not every GPU of the cluster (which made startup quadratic in nodes).
	byPool map[string]map[string]*GPU
	claims map[string]*Claim
	// nsMem and nsComp are the memory and compute charged to each namespace's quota
	// (Tenant.Charge).
	nsMem, nsComp map[string]int64
	// nsReserve is what the namespace's workloads scaled to zero keep of its quota.
	nsReserve map[string]Usage
	// nsGPUs counts each namespace's tenants per GPU; heldMemo is each namespace's held room
	// (held.go) at generation gen, which every change to a GPU's tenants or size moves on.
	nsGPUs   map[string]map[*GPU]int
	heldMemo map[string]HeldRoom
	gen      int

	core coreMirror

	// versions numbers the GPUs' attribute versions; snap is the published GPUs that
	// selectors are evaluated on, rebuilt (with a new Gen) after any GPU's attributes
	// change or a GPU comes or goes (snapStale until then).
	versions  uint64
	snap      selectors.Snapshot
	snapStale bool
}

// New is an empty model of driver's GPUs.
func New(driver string) *Model {
	return &Model{driver: driver, gpus: map[GPUKey]*GPU{}, byPool: map[string]map[string]*GPU{}, claims: map[string]*Claim{},
		nsMem: map[string]int64{}, nsComp: map[string]int64{}, nsReserve: map[string]Usage{},
		nsGPUs: map[string]map[*GPU]int{}, heldMemo: map[string]HeldRoom{}, core: newCoreMirror()}
}

// Account brings the model in line with a claim seen by the informer; it reports whether
// capacity was freed.
func (m *Model) Account(claim *resourceapi.ResourceClaim, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := claimKey(claim)
	cur := m.claims[key]
	if claim.Status.Allocation == nil {
		if cur == nil {
			return false
		}
		if !cur.assumed.IsZero() && now.Sub(cur.assumed) < WriteSettle {
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
func (m *Model) Release(key string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.remove(key) != nil
}

// Rekey moves a claim's shares to another key (a deleted claim's, held while its pods
// run); it reports whether there were any.
func (m *Model) Rekey(key, to string) bool {
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
// has WriteSettle to show it.
func (m *Model) Written(key string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if cur := m.claims[key]; cur != nil {
		cur.assumed = now
	}
}

// SetNodeDevices replaces the devices a node publishes (from all of its slices).
func (m *Model) SetNodeDevices(node string, devs map[string]resourceapi.Device) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, g := range m.byPool[node] {
		if _, ok := devs[name]; !ok && g.known {
			g.known = false
			m.core.dirty, m.snapStale = true, true
			if len(g.tenants) == 0 {
				m.dropGPU(g.key)
			}
		}
	}
	for name, d := range devs {
		g := m.gpuFor(GPUKey{node, name})
		memCap, compCap := int64(0), int64(100)
		if c, ok := d.Capacity[api.CapacityMemory]; ok {
			memCap = c.Value.Value()
		}
		if c, ok := d.Capacity[api.CapacityCompute]; ok {
			compCap = c.Value.Value()
		}
		if !g.known || g.memCap != memCap || g.compCap != compCap {
			m.core.dirty = true
			m.gen++
		}
		if !g.known || !equality.Semantic.DeepEqual(g.attrs, d.Attributes) || !equality.Semantic.DeepEqual(g.capacity, d.Capacity) {
			m.versions++
			g.version, m.snapStale = m.versions, true
			// The placement core is built with each GPU's place on its node.
			if wiring(g.attrs) != wiring(d.Attributes) {
				m.core.dirty = true
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
func (m *Model) SelectorSnapshot() selectors.Snapshot {
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

// EachGPU calls fn for every published GPU, under the model's lock.
func (m *Model) EachGPU(fn func(g *GPU)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, g := range m.gpus {
		if g.known {
			fn(g)
		}
	}
}

// GPUTenants are the tenants of GPU k, whether its slice still publishes it or not (a GPU
// that is no longer published stays in the model while tenants hold it), its memory and
// whether it is published.
func (m *Model) GPUTenants(k GPUKey) (tenants []*Tenant, memCap int64, published bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	g, ok := m.gpus[k]
	if !ok {
		return nil, 0, false
	}
	for _, t := range g.tenants {
		tenants = append(tenants, t)
	}
	return tenants, g.memCap, g.known
}

// GPUMemory is a published GPU's memory (0 when unknown).
func (m *Model) GPUMemory(k GPUKey) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if g, ok := m.gpus[k]; ok && g.known {
		return g.memCap
	}
	return 0
}

// UseOf is what GPU k holds.
func (m *Model) UseOf(k GPUKey) Use {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.gpus[k].Use()
}

// Reserves is a copy of what each namespace's workloads scaled to zero keep of its quota.
func (m *Model) Reserves() map[string]Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.nsReserve)
}

// SetReserve sets what namespace ns's workloads scaled to zero keep of its quota; it
// reports whether that changed.
func (m *Model) SetReserve(ns string, u Usage) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	changed := m.nsReserve[ns] != u
	if changed {
		m.gen++ // what the namespace may hold changed (the reclaimer's loans)
	}
	if u == (Usage{}) {
		delete(m.nsReserve, ns)
	} else {
		m.nsReserve[ns] = u
	}
	return changed
}

// NamespaceUse is one namespace's allocated claims and what they hold.
type NamespaceUse struct {
	Claims    int
	Mem, Comp int64
	// Charged and ChargedComp are what the quota counts: Tenant.Charge and compute, and
	// the room the namespace keeps from others (held.go).
	Charged, ChargedComp int64
}

// ByNamespace sums the allocated claims per namespace; namespaces without any are left out.
func (m *Model) ByNamespace() map[string]NamespaceUse {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]NamespaceUse{}
	for _, rec := range m.claims {
		u := out[rec.namespace]
		u.Claims++
		for _, sh := range rec.shares {
			u.Mem += sh.t.Mem
			u.Charged += sh.t.Charge()
			u.Comp += sh.t.Comp
		}
		out[rec.namespace] = u
	}
	for ns, u := range out {
		h := m.held(ns).Charge()
		u.Charged, u.ChargedComp = u.Charged+h.Mem, u.Comp+h.Comp
		out[ns] = u
	}
	return out
}

func (m *Model) gpuFor(k GPUKey) *GPU {
	g, ok := m.gpus[k]
	if !ok {
		g = &GPU{key: k, keyText: k.String(), node: k.Pool, tenants: map[types.UID]*Tenant{}, compCap: 100, coreNode: -1, coreIndex: -1}
		m.gpus[k] = g
		if m.byPool[k.Pool] == nil {
			m.byPool[k.Pool] = map[string]*GPU{}
		}
		m.byPool[k.Pool][k.Device] = g
	}
	return g
}

func (m *Model) dropGPU(k GPUKey) {
	delete(m.gpus, k)
	m.snapStale = true
	if p := m.byPool[k.Pool]; p != nil {
		delete(p, k.Device)
		if len(p) == 0 {
			delete(m.byPool, k.Pool)
		}
	}
}

// MilliOf is a share in the placement core's units (1000 = one GPU), rounded down so the
// core never thinks a GPU fuller than it is; exact accounting is the model's.
func MilliOf(mem, memCap int64, whole bool) int64 {
	if whole || memCap <= 0 || mem >= memCap {
		return placement.DefaultGPUCapacity
	}
	return min(max(mem*placement.DefaultGPUCapacity/memCap, 1), placement.DefaultGPUCapacity-1)
}

// add records a claim's shares (replacing what was recorded for it). Caller holds mu.
func (m *Model) add(rec *Claim) {
	if old, ok := m.claims[rec.key]; ok {
		m.remove(old.key)
	}
	m.claims[rec.key] = rec
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		g.tenants[t.ShareID] = t
		g.usedMem += t.Mem
		g.usedComp += t.Comp
		t.milli = MilliOf(t.Mem, g.memCap, t.Whole)
		m.core.assign(g, t.milli, +1)
		m.nsMem[rec.namespace] += t.Charge()
		m.nsComp[rec.namespace] += t.Comp
		if m.nsGPUs[rec.namespace] == nil {
			m.nsGPUs[rec.namespace] = map[*GPU]int{}
		}
		m.nsGPUs[rec.namespace][g]++
	}
	m.gen++
}

// remove forgets a claim's shares. Caller holds mu.
func (m *Model) remove(key string) *Claim {
	rec, ok := m.claims[key]
	if !ok {
		return nil
	}
	delete(m.claims, key)
	for _, sh := range rec.shares {
		g, t := sh.gpu, sh.t
		delete(g.tenants, t.ShareID)
		g.usedMem -= t.Mem
		g.usedComp -= t.Comp
		m.core.assign(g, t.milli, -1)
		m.nsMem[rec.namespace] -= t.Charge()
		m.nsComp[rec.namespace] -= t.Comp
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
// get the standard class and no rules. Nothing is read from the claim's metadata, which its
// tenant can write. Caller holds mu.
func (m *Model) recordFromClaim(claim *resourceapi.ResourceClaim) *Claim {
	a := claim.Status.Allocation
	if a == nil {
		return nil
	}
	rec := &Claim{uid: claim.UID, key: claimKey(claim), namespace: claim.Namespace}
	for i, r := range a.Devices.Results {
		if r.Driver != m.driver {
			continue
		}
		g := m.gpuFor(GPUKey{r.Pool, r.Device})
		cfg := AllocationConfig(m.driver, a.Devices.Config, r.Request)
		t := &Tenant{Claim: claim.UID, Key: rec.key, Namespace: claim.Namespace, Latency: api.LatencyStandard,
			Mode: cfg.Mode, Domain: Domain{claim.Namespace, cfg.IsolationDomain}}
		t.ByUs = api.FenceTolerated(r) // an older allocator's: the built-in rules
		if p := cfg.Placement; p != nil {
			t.ByUs, t.MaxCo, t.AllowCrit, t.MaxTenants, t.AllowShare = true, int(p.MaxCoTenants), p.AllowCriticalCoTenants, int(p.MaxTenantsPerGPU), p.AllowSharedGPU
			if p.LatencyClass != "" {
				t.Latency = p.LatencyClass
			}
			if p.MemoryLimit != nil {
				t.BurstCap = p.MemoryLimit.Value()
			}
		}
		if r.ShareID != nil {
			t.ShareID = *r.ShareID
		} else {
			t.ShareID = types.UID(fmt.Sprintf("%s/%d", claim.UID, i))
		}
		if r.ConsumedCapacity == nil {
			t.Whole, t.Mem, t.Comp = true, g.memCap, g.compCap
		} else {
			mem, comp := r.ConsumedCapacity[api.CapacityMemory], r.ConsumedCapacity[api.CapacityCompute]
			t.Mem, t.Comp = mem.Value(), comp.Value()
			t.Whole = g.known && t.Mem >= g.memCap
		}
		rec.shares = append(rec.shares, share{gpu: g, t: t})
	}
	if len(rec.shares) == 0 {
		return nil
	}
	return rec
}

func sameShares(a, b *Claim) bool {
	if len(a.shares) != len(b.shares) {
		return false
	}
	for i := range a.shares {
		if a.shares[i].t.ShareID != b.shares[i].t.ShareID || a.shares[i].gpu != b.shares[i].gpu || a.shares[i].t.Mem != b.shares[i].t.Mem {
			return false
		}
	}
	return true
}

// AllocationConfig reads back the merged config of an allocated request. A config that
// does not decode (an allocation fgpu did not make) counts as the defaults: the plugin
// refuses to prepare it anyway.
func AllocationConfig(driver string, cfgs []resourceapi.DeviceAllocationConfiguration, request string) *api.GpuConfig {
	merged, err := api.MergeConfigs(driver, cfgs, request)
	if err != nil {
		merged = &api.GpuConfig{}
	}
	merged.Normalize()
	return merged
}

// claimKey is namespace/name, the model's key for a claim (as the allocator's queue's).
func claimKey(claim *resourceapi.ResourceClaim) string { return cache.MetaObjectToName(claim).String() }
