package model

import (
	"iter"
	"time"

	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// Tx is the model inside one transaction (Update): what a decision reads, and the shares it
// reserves or gives back. It is valid only until the function given to Update returns.
type Tx struct{ m *Model }

// Update runs fn with the model locked, as one transaction: what fn reads does not change
// under it, and the shares it reserves are seen by the next transaction. fn must not call
// the model's other methods, which take the lock too.
func (m *Model) Update(fn func(tx *Tx)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	fn(&Tx{m})
}

// DecidedUnseen reports whether the model holds a decision on the claim that the informer
// has not shown yet (then the claim must not be decided twice). A decision the informer
// contradicts for longer than WriteSettle is dropped.
func (tx *Tx) DecidedUnseen(key string, now time.Time) bool {
	rec := tx.m.claims[key]
	if rec == nil {
		return false
	}
	if rec.assumed.IsZero() || now.Sub(rec.assumed) < WriteSettle {
		return true
	}
	tx.m.remove(key)
	return false
}

// Gen numbers the model's state: it moves on with every change to a GPU's tenants or size.
func (tx *Tx) Gen() int { return tx.m.gen }

// Add reserves a claim's shares, replacing what was reserved for it.
func (tx *Tx) Add(c *Claim) { tx.m.add(c) }

// Remove gives back what was reserved for claim key.
func (tx *Tx) Remove(key string) { tx.m.remove(key) }

// GPU is the GPU named k, published or only seen in allocations.
func (tx *Tx) GPU(k GPUKey) (*GPU, bool) {
	g, ok := tx.m.gpus[k]
	return g, ok
}

// GPUs are the published GPUs, in no order.
func (tx *Tx) GPUs() iter.Seq[*GPU] {
	return func(yield func(*GPU) bool) {
		for _, g := range tx.m.gpus {
			if g.known && !yield(g) {
				return
			}
		}
	}
}

// Charged is what namespace ns's claims count against its quota (Tenant.Charge, and
// compute), without the room it holds (Held) or keeps for workloads scaled to zero
// (Reserve).
func (tx *Tx) Charged(ns string) Usage { return Usage{tx.m.nsMem[ns], tx.m.nsComp[ns]} }

// Reserve is what namespace ns's workloads scaled to zero keep of its quota.
func (tx *Tx) Reserve(ns string) Usage { return tx.m.nsReserve[ns] }

// Held is the room namespace ns keeps from other namespaces.
func (tx *Tx) Held(ns string) HeldRoom { return tx.m.held(ns) }

// EnsureCore brings the placement core up to date (see Model.ensureCore).
func (tx *Tx) EnsureCore(policies PolicyFor, nodes NodeSource) error {
	return tx.m.ensureCore(policies, nodes)
}

// CoreGPUs are the placement core's GPUs by core node and index, as of the last
// EnsureCore; they must not be changed.
func (tx *Tx) CoreGPUs() [][]*GPU { return tx.m.core.coreGPU }

// CoreGPUAt is the GPU at the placement core's node ni, GPU gi; nil past the core's.
func (tx *Tx) CoreGPUAt(ni, gi int) *GPU {
	c := tx.m.core.coreGPU
	if ni < 0 || ni >= len(c) || gi < 0 || gi >= len(c[ni]) {
		return nil
	}
	return c[ni][gi]
}

// RefMem is the GPU memory requests are sized against in the core: the most common.
func (tx *Tx) RefMem() int64 { return tx.m.core.refMem }

// SmallestGPU is the smallest GPU's memory and compute: the least a whole GPU takes of a
// quota before one is chosen.
func (tx *Tx) SmallestGPU() Usage { return Usage{tx.m.core.minMem, tx.m.core.minComp} }

// Scheduler is the placement core's scheduler for a latency class.
func (tx *Tx) Scheduler(l api.LatencyClass) *placement.Scheduler { return tx.m.core.scheduler(l) }

// Observe counts a claim's request in the workload the standard class's policy learns,
// once per claim.
func (tx *Tx) Observe(uid types.UID, r *placement.Request, policies PolicyFor) {
	tx.m.core.observe(uid, r, policies)
}
