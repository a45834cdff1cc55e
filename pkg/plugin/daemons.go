package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// daemons is the MPS applier: it starts, adopts, stops and checks the MPS control daemons
// the prepared claims need (mps.Manager does the work), sets the compute modes that go with
// them, and remembers what it still owes: daemons to stop, daemons that died under claims.
// Its own maps are guarded by State's lock, which it releases while a daemon starts or
// stops or is asked (a tenant controls its daemon's control socket).
type daemons struct {
	mps     *mps.Manager
	l       *ledger
	mu      *sync.Mutex // State's lock
	devices map[string]gpu.Device
	modes   *computeModes
	guards  *daemonGuards
	foreign *foreignWatch
	// spares are daemons started ahead that no claim uses and none may stop.
	spares *spareDaemons
	// client records Node events; nil outside a cluster.
	client   kubernetes.Interface
	nodeName string

	// diedUnder are the MPS daemons the plugin found dead while claims were prepared on
	// them (at its start, or mpsDeadChecks checks in a row), with those claims: their
	// clients lost their server, and the restarted daemon does not make them whole
	// (check reports them until those claims are unprepared).
	diedUnder map[string]map[string]bool
	// unanswered counts each daemon's failed checks in a row (check).
	unanswered map[string]int
	// unstopped are the daemons no claim uses that are still to be stopped (their last stop
	// failed, or an unprepare found them left over); sweep says a listing of the daemons
	// failed. The claim whose unprepare failed is gone from the checkpoint, so its retry and
	// check try again (retryStops).
	unstopped map[string]bool
	sweep     bool
}

// ensure starts or adopts an MPS daemon with its domain's defaults; started says it
// was started anew (mps.Manager.Ensure). The caller holds State's lock; with release, it is
// released meanwhile: a start may take StartTimeout and more (a tenant can wedge its own
// domain's daemon), and no other domain's prepare, unprepare or check may wait for it.
// mps.Manager serialises the calls for one daemon, and the defaults are applied again when
// the domain's claims changed meanwhile, so that the last caller leaves the current ones.
func (d *daemons) ensure(ctx context.Context, key, gpuUUID string, release bool) (started bool, err error) {
	limits := d.l.domainLimits(key)
	if !release {
		started, err = d.mps.Ensure(ctx, key, gpuUUID, limits)
		if err == nil {
			d.guards.mark(key)
		}
		return started, err
	}
	for {
		d.mu.Unlock()
		st, err := d.mps.Ensure(ctx, key, gpuUUID, limits)
		d.mu.Lock()
		started = started || st
		if err != nil {
			return started, err
		}
		now := d.l.domainLimits(key)
		if now == limits {
			d.guards.mark(key)
			return started, nil
		}
		limits = now
	}
}

// release stops the daemons own of a claim just removed from the ledger once no claim uses
// them, and notes every other daemon no claim uses as still to be stopped.
// Only the claim's own daemons are stopped here: a daemon left over by another domain
// (its stop failed, or is under way) may take a command timeout to stop, and this
// unprepare must not wait for it. The MPS check stops those.
func (d *daemons) release(ctx context.Context, own []string, release bool) error {
	all, listErr := d.mps.Keys(ctx)
	if listErr != nil {
		d.sweep = true
	}
	used := d.l.usedDaemons()
	for _, k := range all {
		if !used[k] && !slices.Contains(own, k) && !d.spares.has(k) {
			d.unstopped[k] = true
		}
	}
	return errors.Join(listErr, d.stopUnused(ctx, own, release))
}

// stopStray stops every daemon present that no claim uses, also those no entry accounts
// for (recover). Caller holds State's lock, which is not released.
func (d *daemons) stopStray(ctx context.Context) error {
	keys, err := d.mps.Keys(ctx)
	if err != nil {
		return err
	}
	return d.stopUnused(ctx, keys, false)
}

// stopUnused stops those of the daemons keys that no claim uses. The caller holds
// State's lock; with release, it is released while the daemons are asked for their servers and
// stopped: a tenant controls its daemon's control socket and can make each command wait its
// whole timeout, and no other domain's prepare or unprepare may wait for that. They are
// stopped concurrently, so that one domain's slow stop delays no other's, and each only if
// no prepare took it meanwhile. A failed stop is kept in unstopped and tried again.
func (d *daemons) stopUnused(ctx context.Context, keys []string, release bool) error {
	used := d.l.usedDaemons()
	keys = slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(keys))), func(k string) bool {
		if used[k] || d.spares.has(k) {
			delete(d.unstopped, k)
			return true
		}
		return false
	})
	stillUsed := func(key string) func() bool {
		if !release {
			return nil // State's lock is held throughout
		}
		return func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.l.usedDaemons()[key]
		}
	}
	servers := make([][]int, len(keys))
	errs := make([]error, len(keys))
	if release && len(keys) > 0 {
		d.mu.Unlock()
	}
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			servers[i] = d.foreign.serversOf(ctx, k)
			errs[i] = d.mps.StopUnlessUsed(ctx, k, stillUsed(k))
		})
	}
	wg.Wait()
	if release && len(keys) > 0 {
		d.mu.Lock()
	}
	for i, k := range keys {
		d.foreign.own(servers[i])
		if errs[i] != nil {
			d.unstopped[k] = true
		} else {
			delete(d.unstopped, k)
		}
	}
	for _, dev := range d.devices {
		errs = append(errs, d.modes.sync(ctx, dev.UUID))
	}
	return errors.Join(errs...)
}

// retryStops stops the daemons no claim uses that are still to be stopped (unstopped, and
// after a failed listing all of them), as stopUnused does. A failure is only logged:
// the caller's claim is not the one that holds them.
func (d *daemons) retryStops(ctx context.Context, release bool) {
	if d.sweep {
		all, err := d.mps.Keys(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Listing the MPS daemons to stop those no prepared claim uses; trying again at the next MPS check")
			return
		}
		d.sweep = false
		for _, k := range all {
			d.unstopped[k] = true
		}
	}
	if len(d.unstopped) == 0 {
		return
	}
	if err := d.stopUnused(ctx, slices.Collect(maps.Keys(d.unstopped)), release); err != nil {
		klog.FromContext(ctx).Error(err, "Stopping the MPS daemons no prepared claim uses; trying again at the next MPS check")
	}
}

// ReasonMPSDaemonRestarted is the Node event of an MPS daemon that prepared claims used and
// that was found stopped.
const ReasonMPSDaemonRestarted = "FgpuMPSDaemonRestarted"

// wasDown reports an MPS daemon found not running while prepared claims other than
// claim uid use it: a tenant quit it, or its pod died or was deleted. Their running CUDA
// processes lost their server.
func (d *daemons) wasDown(ctx context.Context, p *checkpoint.PreparedDevice, uid string) {
	var users int
	for u, e := range d.l.cp.Claims {
		// A claim still being prepared (the kubelet prepares claims concurrently) has given
		// no container the daemon yet: its processes lost nothing.
		if u == uid || e.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, q := range e.Devices {
			if q.MPSKey == p.MPSKey {
				users++
				// Its pods' CUDA processes lost their server: the MPS check moves them.
				d.diedFor(p.MPSKey, u)
				break
			}
		}
	}
	if users == 0 {
		return
	}
	msg := fmt.Sprintf("the MPS server of GPU %s (%s) for isolation domain %s was not running while %d prepared claim(s) used it (stopped through its pipe directory, or its pod died or was deleted); starting it again: their CUDA processes lost it, so their pods are moved",
		p.Device, p.GPUUUID, p.IsolationDomain, users)
	logger := klog.FromContext(ctx)
	logger.Error(nil, msg, "daemon", p.MPSKey)
	if d.client == nil {
		return
	}
	if err := nodeEvent(ctx, d.client, d.nodeName, corev1.EventTypeWarning, ReasonMPSDaemonRestarted, msg); err != nil {
		logger.Error(err, "Recording a Node event about a stopped MPS daemon")
	}
}

// diedFor records that daemon key died under claim uid.
func (d *daemons) diedFor(key, uid string) {
	if d.diedUnder[key] == nil {
		d.diedUnder[key] = map[string]bool{}
	}
	d.diedUnder[key][uid] = true
}
