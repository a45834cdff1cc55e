package plugin

import (
	"context"
	"maps"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// daemonGuard is a launcher whose daemons an eviction could take (mps.PodLauncher).
type daemonGuard interface {
	Protect(ctx context.Context, key string, protect bool) error
}

// daemonGuards is the eviction-guard applier: it keeps an MPS daemon's pod from being evicted
// while a client of it is a pod that a drain evicts (mps.PodLauncher's disruption budget).
// A transaction marks the daemons whose guard may have to change; State.unlock brings them
// up to date after releasing State's lock, whose ledger each round reads again.
type daemonGuards struct {
	// mps's launcher guards the daemons where it can (daemonGuard); read on each use.
	mps *mps.Manager
	l   *ledger
	mu  *sync.Mutex // State's lock
	// marked are the daemons whose guard may have to change; State's lock guards it.
	marked map[string]bool
	rounds rounds
}

// enabled says whether the daemons' clients are to be watched for mark.
func (g *daemonGuards) enabled() bool {
	_, ok := g.mps.Launcher.(daemonGuard)
	return ok
}

// mark keeps daemon key from being evicted (a drain's or the cluster autoscaler's
// eviction) while a client of it is a pod that such a drain evicts, which its own disruption
// budget may forbid: the daemon goes after it, when the plugin stops the daemon at the last
// unprepare. A DaemonSet's pod does not hold it (a drain leaves it on the node, so it would
// hold the drain forever), and a daemon without claims is held by nothing (its stop may have
// failed). A claim whose pods are not known holds it. Caller holds State's lock; the guard
// changes at its unlock, whose API calls no other domain's prepare waits for.
func (g *daemonGuards) mark(key string) {
	if !g.enabled() {
		return
	}
	if g.marked == nil {
		g.marked = map[string]bool{}
	}
	g.marked[key] = true
}

// markClaim is mark for the daemons of a claim.
func (g *daemonGuards) markClaim(e *checkpoint.ClaimEntry) {
	for _, p := range e.Devices {
		if p.MPSKey != "" {
			g.mark(p.MPSKey)
		}
	}
}

// take returns the marked daemons and forgets them. Caller holds State's lock.
func (g *daemonGuards) take() []string {
	keys := slices.Sorted(maps.Keys(g.marked))
	g.marked = nil
	return keys
}

// unlock releases State's lock, then brings the guards of the marked daemons up to date
// (update). Caller holds State's lock.
func (g *daemonGuards) unlock(ctx context.Context) {
	keys := g.take()
	g.mu.Unlock()
	g.update(ctx, keys)
}

// update brings the guards of daemons keys up to date: a PodDisruptionBudget's get, create
// or delete each, made without State's lock, so that a tenant whose pods change often holds
// up no other domain's prepare. Caller does not hold State's lock.
func (g *daemonGuards) update(ctx context.Context, keys []string) {
	pg, ok := g.mps.Launcher.(daemonGuard)
	if !ok {
		return
	}
	for _, key := range keys {
		if !g.rounds.start(key) {
			continue // being updated: that caller updates it again, from the state then
		}
		for {
			g.mu.Lock()
			held := g.l.daemonHeld(key)
			g.mu.Unlock()
			if err := pg.Protect(ctx, key, held); err != nil {
				// Tried again at the domain's next prepare, unprepare or pod change.
				klog.FromContext(ctx).Error(err, "Guarding an MPS daemon against eviction", "daemon", key, "protect", held)
			}
			if g.rounds.end(key) {
				break
			}
		}
	}
}

// rounds lets one caller at a time update a key; another that comes meanwhile asks that
// caller for one more round instead of waiting, so the last round sees the last state and
// no caller waits for another key's, or another caller's, update. Its lock is its own.
type rounds struct {
	mu    sync.Mutex
	busy  map[string]bool
	again map[string]bool
}

// start reports whether the caller is to update key (false: another is, and goes again).
func (r *rounds) start(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy[key] {
		r.again[key] = true
		return false
	}
	if r.busy == nil {
		r.busy, r.again = map[string]bool{}, map[string]bool{}
	}
	r.busy[key] = true
	return true
}

// end ends the caller's update of key unless another round was asked for.
func (r *rounds) end(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.again[key] {
		delete(r.again, key)
		return false
	}
	delete(r.busy, key)
	return true
}
