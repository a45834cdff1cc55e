package plugin

import (
	"context"
	"slices"

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
// failed). A claim whose pods are not known holds it. Caller holds s.mu.
func (s *State) guardDaemon(ctx context.Context, key string) {
	g, ok := s.mps.Launcher.(daemonGuard)
	if !ok {
		return
	}
	held := false
	for _, e := range s.cp.Claims {
		if slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return p.MPSKey == key }) &&
			(len(e.Pods) == 0 || slices.ContainsFunc(e.Pods, func(p checkpoint.PodRef) bool { return !p.DaemonSet })) {
			held = true
			break
		}
	}
	if err := g.Protect(ctx, key, held); err != nil {
		// Tried again at the domain's next prepare, unprepare or pod change.
		klog.FromContext(ctx).Error(err, "Guarding an MPS daemon against eviction", "daemon", key, "protect", held)
	}
}

// guardDaemons is guardDaemon for the daemons of a claim.
func (s *State) guardDaemons(ctx context.Context, e *checkpoint.ClaimEntry) {
	for _, p := range e.Devices {
		if p.MPSKey != "" {
			s.guardDaemon(ctx, p.MPSKey)
		}
	}
}
