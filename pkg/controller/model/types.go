// Package model is the allocator's view of every fgpu GPU and every allocated fgpu claim,
// with the placement core built over it. It owns that state and its lock: the informers
// change it through Model's methods, and a decision reads and reserves through one
// transaction (Model.Update), so two decisions never hand out the same capacity.
package model

import (
	"iter"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// GPUKey names a device: pool (fgpu's pool is the node name) and device.
type GPUKey struct{ Pool, Device string }

func (k GPUKey) String() string { return k.Pool + "/" + k.Device }

// Domain is an isolation domain: a namespace and a sub-domain of it. Claims share an MPS
// server only within one domain; the sub-domain, which a claim may name, only subdivides its
// own namespace. The plugin derives the MPS server from the same pair (pkg/mps Daemon).
type Domain struct{ Namespace, Sub string }

// String is the domain as the plugin shows it (FGPU_ISOLATION_DOMAIN): "<namespace>/<sub>".
func (d Domain) String() string { return d.Namespace + "/" + d.Sub }

// Usage is GPU memory (bytes) and compute (percent of a GPU).
type Usage struct{ Mem, Comp int64 }

// GPU is one published device and the shares allocated on it. Only the model changes it;
// others read it inside a transaction or under EachGPU.
type GPU struct {
	key      GPUKey
	node     string
	known    bool // published in a ResourceSlice (else only seen in allocations)
	memCap   int64
	compCap  int64
	attrs    map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	capacity map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	taints   []resourceapi.DeviceTaint // those a claim must tolerate (not the fence, not None)
	usedMem  int64
	usedComp int64
	tenants  map[types.UID]*Tenant // by share ID
	// coreNode and coreIndex are its place in the placement core (-1: not in it).
	coreNode  int
	coreIndex int
	// version changes with attrs and capacity: selector verdicts are kept per version;
	// keyText is key.String(), which they are kept by.
	version uint64
	keyText string
}

func (g *GPU) Key() GPUKey { return g.key }

// KeyText is Key().String(), made once.
func (g *GPU) KeyText() string { return g.keyText }
func (g *GPU) Node() string    { return g.node }
func (g *GPU) MemCap() int64   { return g.memCap }
func (g *GPU) CompCap() int64  { return g.compCap }
func (g *GPU) UsedMem() int64  { return g.usedMem }
func (g *GPU) UsedComp() int64 { return g.usedComp }

// Version numbers its attributes and capacity as selectors saw them.
func (g *GPU) Version() uint64 { return g.version }

// Attributes and Capacity are as published; they must not be changed.
func (g *GPU) Attributes() map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	return g.attrs
}
func (g *GPU) Capacity() map[resourceapi.QualifiedName]resourceapi.DeviceCapacity {
	return g.capacity
}

// Taints are those a claim placed on it must tolerate.
func (g *GPU) Taints() []resourceapi.DeviceTaint { return g.taints }

// Tenants are its shares, in no order.
func (g *GPU) Tenants() iter.Seq[*Tenant] {
	return func(yield func(*Tenant) bool) {
		for _, t := range g.tenants {
			if !yield(t) {
				return
			}
		}
	}
}

func (g *GPU) NumTenants() int { return len(g.tenants) }

// Tenant is its share shareID, nil where it has none.
func (g *GPU) Tenant(shareID types.UID) *Tenant { return g.tenants[shareID] }

// Core is its place in the placement core; ok is false where it has none.
func (g *GPU) Core() (node, index int, ok bool) {
	return g.coreNode, g.coreIndex, g.coreNode >= 0
}

// Use is what a GPU holds as the model sees it.
type Use struct {
	Mem, Comp int64
	Tenants   int
}

// Use is what g holds; nil holds nothing.
func (g *GPU) Use() Use {
	if g == nil {
		return Use{}
	}
	return Use{Mem: g.usedMem, Comp: g.usedComp, Tenants: len(g.tenants)}
}

// Tenant is one share of a GPU: what the co-tenancy rules need to know about it. A decision
// makes it (or the model, from an allocation) and the model owns it once added.
type Tenant struct {
	Claim      types.UID
	Key        string // namespace/name
	Namespace  string
	ShareID    types.UID
	Mem, Comp  int64
	Whole      bool
	Domain     Domain
	Mode       api.SharingMode
	Latency    api.LatencyClass
	MaxCo      int
	AllowCrit  bool
	MaxTenants int
	AllowShare bool
	ByUs       bool
	// BurstCap is the memory MPS lets a bursting share use, above Mem (its guaranteed
	// part); 0 for a share that does not burst. Workload is whose share it is, where the
	// allocator placed it since it started (zero after a restart).
	BurstCap int64
	Workload api.SizingWorkload

	milli int64 // its share in the placement core's units
}

// Limit is what a tenant may use: its burst cap, or what it holds.
func (t *Tenant) Limit() int64 {
	if t.BurstCap > 0 {
		return t.BurstCap
	}
	return t.Mem
}

// Charge is what a tenant counts against its namespace's memory quota: a bursting share its
// cap, not the guarantee that packing counts. Its GPU is closed to other namespaces, and a
// share guaranteed little (its use mostly low, with peaks) could otherwise hold GPU after
// GPU under a small quota.
func (t *Tenant) Charge() int64 { return t.Limit() }

// Claim is what the model holds for one allocated claim: its shares.
type Claim struct {
	uid       types.UID
	key       string
	namespace string
	shares    []share
	assumed   time.Time // when the allocator decided it; zero once the informer showed it
}

type share struct {
	gpu *GPU
	t   *Tenant
}

// NewClaim starts the record of a claim a decision places now.
func NewClaim(uid types.UID, key, namespace string, now time.Time) *Claim {
	return &Claim{uid: uid, key: key, namespace: namespace, assumed: now}
}

// AddShare adds one share to a claim before it is added to the model (Tx.Add); a claim the
// model holds is changed only by removing and adding it again.
func (c *Claim) AddShare(g *GPU, t *Tenant) { c.shares = append(c.shares, share{g, t}) }

func (c *Claim) Key() string { return c.key }
