package plugin

import (
	"context"
	"maps"
	"slices"
	"sync"

	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// daemonGuard is a launcher whose daemons an eviction could take (mps.PodLauncher).
type daemonGuard interface {
	Protect(ctx context.Context, key string, protect bool) error
}

// guardsDaemons says whether the daemons' clients are to be watched for guardDaemon.
func (s *State) guardsDaemons() bool {
	_, ok := s.mps.Launcher.(daemonGuard)
	return ok
}

// guardDaemon keeps daemon key from being evicted (a drain's or the cluster autoscaler's
// eviction) while a client of it is a pod that such a drain evicts, which its own disruption
// budget may forbid: the daemon goes after it, when the plugin stops the daemon at the last
// unprepare. A DaemonSet's pod does not hold it (a drain leaves it on the node, so it would
// hold the drain forever), and a daemon without claims is held by nothing (its stop may have
// failed). A claim whose pods are not known holds it. Caller holds s.mu; the guard changes
// at its unlock, whose API calls no other domain's prepare waits for.
func (s *State) guardDaemon(_ context.Context, key string) {
	if _, ok := s.mps.Launcher.(daemonGuard); !ok {
		return
	}
	if s.guards == nil {
		s.guards = map[string]bool{}
	}
	s.guards[key] = true
}

// daemonHeld says whether daemon key is to be guarded now (see guardDaemon). Caller holds
// s.mu.
func (s *State) daemonHeld(key string) bool {
	for _, e := range s.cp.Claims {
		if slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return p.MPSKey == key }) &&
			(len(e.Pods) == 0 || slices.ContainsFunc(e.Pods, func(p checkpoint.PodRef) bool { return !p.DaemonSet })) {
			return true
		}
	}
	return false
}

// unlock releases s.mu, then brings the guards of the daemons guardDaemon named up to date:
// a PodDisruptionBudget's get, create or delete each, made without s.mu, so that a tenant
// whose pods change often holds up no other domain's prepare.
func (s *State) unlock(ctx context.Context) {
	keys := slices.Sorted(maps.Keys(s.guards))
	s.guards = nil
	s.mu.Unlock()
	g, ok := s.mps.Launcher.(daemonGuard)
	if !ok {
		return
	}
	for _, key := range keys {
		if !s.guardRounds.start(key) {
			continue // being updated: that caller updates it again, from the state then
		}
		for {
			s.mu.Lock()
			held := s.daemonHeld(key)
			s.mu.Unlock()
			if err := g.Protect(ctx, key, held); err != nil {
				// Tried again at the domain's next prepare, unprepare or pod change.
				klog.FromContext(ctx).Error(err, "Guarding an MPS daemon against eviction", "daemon", key, "protect", held)
			}
			if s.guardRounds.end(key) {
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

// guardDaemons is guardDaemon for the daemons of a claim.
func (s *State) guardDaemons(ctx context.Context, e *checkpoint.ClaimEntry) {
	for _, p := range e.Devices {
		if p.MPSKey != "" {
			s.guardDaemon(ctx, p.MPSKey)
		}
	}
}
