package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/driverroot"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// State is the node's prepared claims as one transaction: plan → check → checkpoint →
// apply each side effect → checkpoint, and the reverse for an unprepare. The checkpoint
// (ledger) is the transaction's; each side effect is an applier of its own (MPS daemons and
// their compute modes, cgroup memory caps, CDI specs, eviction guards, the foreign-process
// watch), which reads the ledger and keeps whatever else it needs. Every method keeps disk,
// processes and checkpoint consistent, also across a crash; mu serialises them, and is
// released only where an applier says so (a daemon starting or stopping, a guard's API call).
type State struct {
	cfg     Config
	backend gpu.Backend
	devices map[string]gpu.Device // by device name

	mu sync.Mutex
	*ledger

	planner  *planner
	room     *room
	refusals *refusals
	cdi      *cdiSpecs
	daemons  *daemons
	modes    *computeModes
	guards   *daemonGuards
	caps     *memoryCaps
	foreign  *foreignWatch
	spares   *spareDaemons
}

// NewState loads the checkpoint and recovers from whatever a previous run left half done.
// A corrupt checkpoint is copied aside and rebuilt from the node and the API through client;
// without a client (nil) it stops the start instead.
func NewState(ctx context.Context, cfg Config, backend gpu.Backend, client kubernetes.Interface) (*State, error) {
	devs, err := backend.Devices()
	if err != nil {
		return nil, fmt.Errorf("discover GPUs: %w", err)
	}
	// The kubelet plugin helper listens in this directory but does not create it.
	if err := os.MkdirAll(cfg.PluginDataDir, 0o750); err != nil {
		return nil, fmt.Errorf("create plugin data directory: %w", err)
	}
	var driverFiles []cdi.Mount
	if cfg.DriverRoot != "" {
		driver, err := driverroot.Discover(klog.FromContext(ctx), driverroot.Root{Host: cfg.DriverRoot, Local: cfg.DriverRootLocal})
		if err != nil {
			return nil, fmt.Errorf("NVIDIA driver for containers: %w (set --driver-root, the chart's kubeletPlugin.driverRoot, to where the driver is installed)", err)
		}
		driverFiles = driver.Mounts
		klog.FromContext(ctx).Info("Containers get the NVIDIA driver", "driverRoot", cfg.DriverRoot, "version", driver.Version, "files", len(driver.Mounts))
	}
	if err := mps.CheckRoot(cfg.MPSRoot); err != nil {
		return nil, err
	}
	w, err := cdi.NewWriter(cfg.CDIDir, driverFiles...)
	if err != nil {
		return nil, err
	}
	m := &mps.Manager{Root: cfg.MPSRoot, Binary: backend.MPSControlBinary()}
	if b, ok := backend.(interface{ MPSDaemonEnv(string) []string }); ok {
		m.DaemonEnv = b.MPSDaemonEnv
	}
	switch pc := cfg.MPSPods; {
	case cfg.MPSLauncher != nil:
		m.Launcher = cfg.MPSLauncher
		m.ShmSize = pc.ShmSize
	case pc.Image != "":
		if client == nil {
			return nil, errors.New("MPS daemons in pods need an API client")
		}
		m.Launcher = &mps.PodLauncher{Client: client, Namespace: pc.Namespace, NodeName: cfg.NodeName,
			Image: pc.Image, PullPolicy: pc.PullPolicy, DriverRoot: pc.DriverRoot, HostPaths: pc.HostPaths,
			ServiceAccount: pc.ServiceAccount, PriorityClass: pc.PriorityClass}
		m.ShmSize = pc.ShmSize
	}
	// Before the first control command: none may follow a symlink a tenant put in its
	// pipe directory.
	if err := m.OpenControlView(); err != nil {
		return nil, err
	}
	s := newState(ctx, cfg, backend, client, w, m)
	for _, d := range devs {
		s.devices[d.Name()] = d
	}
	s.caps.detect(ctx, cfg.CgroupRoot)
	if err := s.loadOrRebuild(ctx, client); err != nil {
		return nil, err
	}
	// Before recover sets any compute mode: a GPU busy with someone else's work keeps its own.
	// The servers of daemons recover stops are fgpu's, not someone else's.
	s.foreign.own(s.foreign.ownServerPIDs(ctx))
	for _, d := range s.devices {
		s.foreign.refreshGPU(ctx, d.UUID, "")
	}
	if err := s.recover(ctx); err != nil {
		return nil, fmt.Errorf("recover prepared claims: %w", err)
	}
	s.mu.Lock()
	s.unlock(ctx) // the guards of the daemons recover adopted or started
	return s, nil
}

// newState wires the transaction to its appliers; the devices are filled in by the caller.
func newState(ctx context.Context, cfg Config, backend gpu.Backend, client kubernetes.Interface, w *cdi.Writer, m *mps.Manager) *State {
	s := &State{cfg: cfg, backend: backend, devices: map[string]gpu.Device{},
		ledger: &ledger{store: checkpoint.NewStore(cfg.CheckpointPath())}}
	s.cdi = &cdiSpecs{Writer: w, devices: s.devices, cfg: cfg, mps: m}
	s.foreign = newForeignWatch(cfg, backend, m, s.ledger)
	s.modes = &computeModes{backend: backend, l: s.ledger, foreign: s.foreign}
	s.guards = &daemonGuards{mps: m, l: s.ledger, mu: &s.mu}
	s.spares = newSpareDaemons(m, &s.mu, s.ledger, s.foreign, s.devices, cfg.NodeName)
	s.daemons = &daemons{mps: m, l: s.ledger, mu: &s.mu, devices: s.devices, modes: s.modes, guards: s.guards, foreign: s.foreign, spares: s.spares,
		client: client, nodeName: cfg.NodeName,
		diedUnder: map[string]map[string]bool{}, unanswered: map[string]int{}, unstopped: map[string]bool{}}
	s.caps = &memoryCaps{l: s.ledger, mu: &s.mu, devices: s.devices, specs: s.cdi, background: ctx}
	s.planner = &planner{cfg: cfg, devices: s.devices, caps: s.caps}
	s.room = &room{cfg: cfg, devices: s.devices, l: s.ledger}
	s.refusals = &refusals{cfg: cfg, l: s.ledger}
	return s
}

// Devices returns the node's GPUs in index order.
func (s *State) Devices() []gpu.Device {
	out := make([]gpu.Device, 0, len(s.devices))
	for _, d := range s.devices {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Index < out[j].Index })
	return out
}

// Prepare prepares one claim: idempotent, and all-or-nothing.
func (s *State) Prepare(ctx context.Context, claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	return s.PrepareFor(ctx, claim, nil)
}

// PrepareFor prepares a claim for pods of this node (from its reservedFor, checked against the
// API), whose cgroups get its GPU memory caps where the GPU supports it. The kubelet prepares a
// claim once, for the first of its pods on the node: later pods come through AddPods.
func (s *State) PrepareFor(ctx context.Context, claim *resourceapi.ResourceClaim, pods []checkpoint.PodRef) ([]kubeletplugin.Device, error) {
	s.mu.Lock()
	defer s.unlock(ctx)
	deadline := time.Now().Add(unprepareWait)
	for {
		devices, err := s.prepare(ctx, claim, pods, deadline)
		if !errors.Is(err, errPrepareAgain) {
			return devices, err
		}
	}
}

// errPrepareAgain: the claim's entry changed while s.mu was released; start over.
var errPrepareAgain = errors.New("the claim was prepared or unprepared meanwhile")

// prepare is one pass of PrepareFor: plan → check → checkpoint → apply → checkpoint.
// Caller holds s.mu.
func (s *State) prepare(ctx context.Context, claim *resourceapi.ResourceClaim, pods []checkpoint.PodRef, deadline time.Time) ([]kubeletplugin.Device, error) {
	uid := string(claim.UID)
	if e, ok := s.cp.Claims[uid]; ok {
		if e.State == checkpoint.PrepareCompleted {
			if err := s.addPods(ctx, e, pods); err != nil {
				return nil, err
			}
			return pluginDevices(e), nil
		}
		if err := s.rollback(ctx, uid, true); err != nil {
			return nil, err
		}
	}
	if err := s.refusals.before(claim); err != nil {
		return nil, err
	}
	planned, err := s.planner.plan(claim)
	if err == nil {
		err = s.checkRoom(ctx, claim, planned, deadline)
	}
	if errors.Is(err, errPrepareAgain) {
		return nil, err
	}
	if err != nil {
		s.refusals.remember(ctx, claim, err)
		return nil, err
	}
	// checkRoom looked up the domain's daemons last without releasing State's lock since.
	s.spares.assign(ctx, planned)
	entry := &checkpoint.ClaimEntry{Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted, Devices: planned, Pods: pods}
	s.cp.Claims[uid] = entry
	if err := s.save(); err != nil {
		delete(s.cp.Claims, uid)
		return nil, err
	}
	if err := s.apply(ctx, uid, entry, true); err != nil {
		if s.cp.Claims[uid] != entry {
			return nil, err // unprepared or prepared again while s.mu was released
		}
		if rbErr := s.rollback(ctx, uid, true); rbErr != nil {
			klog.FromContext(ctx).Error(rbErr, "Rolling back a failed prepare", "claim", klog.KObj(claim))
		}
		return nil, err
	}
	if faults != nil {
		faults.PrepareApplied(ctx)
	}
	entry.State = checkpoint.PrepareCompleted
	if err := s.save(); err != nil {
		entry.State = checkpoint.PrepareStarted
		return nil, err
	}
	return pluginDevices(entry), nil
}

// AddPods records more pods of this node for a prepared claim (checked against the API by the
// caller) and caps their cgroups; a claim that is not prepared (any more) is left alone.
func (s *State) AddPods(ctx context.Context, uid string, pods []checkpoint.PodRef) error {
	s.mu.Lock()
	defer s.unlock(ctx)
	e, ok := s.cp.Claims[uid]
	if !ok || e.State != checkpoint.PrepareCompleted {
		return nil
	}
	return s.addPods(ctx, e, pods)
}

// preparedClaim is the UID of the prepared claim ns/name ("" if none) and its pods.
func (s *State) preparedClaim(ns, name string) (uid string, pods []checkpoint.PodRef) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uid, e := range s.cp.Claims {
		if e.Namespace == ns && e.Name == name && e.State == checkpoint.PrepareCompleted {
			return uid, slices.Clone(e.Pods)
		}
	}
	return "", nil
}

func (s *State) addPods(ctx context.Context, e *checkpoint.ClaimEntry, pods []checkpoint.PodRef) error {
	var added []checkpoint.PodRef
	changed := false
	for _, p := range pods {
		i := slices.IndexFunc(e.Pods, func(q checkpoint.PodRef) bool { return q.UID == p.UID })
		switch {
		case i < 0:
			added = append(added, p)
		case e.Pods[i] != p:
			// Its controller changed; saved with the next change if not now.
			e.Pods[i], changed = p, true
		}
	}
	if len(added) == 0 && !changed {
		return nil
	}
	e.Pods = append(e.Pods, added...)
	if err := s.save(); err != nil {
		e.Pods = e.Pods[:len(e.Pods)-len(added)]
		return err
	}
	s.caps.limitPods(ctx, e, added)
	s.guards.markClaim(e)
	return nil
}

// apply performs the side effects of a PrepareStarted entry, one applier after the other:
// compute mode and MPS daemon, cgroup caps, CDI spec. With release, s.mu is released while
// an MPS daemon starts (see daemons.ensure); the entry is then checked to be still the
// claim's.
func (s *State) apply(ctx context.Context, uid string, e *checkpoint.ClaimEntry, release bool) error {
	for i := range e.Devices {
		p := &e.Devices[i]
		if p.MPSKey != "" || p.Mode == string(configapi.SharingModeTimeSlicing) {
			if err := s.modes.sync(ctx, p.GPUUUID); err != nil {
				return err
			}
		}
		if p.MPSKey != "" {
			started, err := s.daemons.ensure(ctx, p.MPSKey, p.GPUUUID, release)
			if started {
				s.daemons.wasDown(ctx, p, uid)
			}
			if err != nil {
				return err
			}
			if s.cp.Claims[uid] != e {
				return fmt.Errorf("claim %s/%s was unprepared or prepared again while its MPS daemon started", e.Namespace, e.Name)
			}
		}
	}
	// Before the spec: a claim none of whose pods got its cgroup cap says mps-per-process.
	s.caps.limitPods(ctx, e, e.Pods)
	ids, err := s.cdi.write(uid, e)
	if err != nil {
		return err
	}
	for i := range e.Devices {
		e.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

// usePodWatch gives the state the node's pod watch, for checkRoom.
func (s *State) usePodWatch(l corelisters.PodLister) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.room.pods = l
}

// unprepareWait is how long a prepare that other prepared claims refuse waits for those of
// them whose pods are gone to be unprepared: the allocator frees a share once its pod is
// done or its claim deleted, which can come a moment before the kubelet unprepares the claim,
// and a refusal would cost the new pod the allocator's bind timeout and the kubelet's retry.
const unprepareWait = 10 * time.Second

// checkRoom is room.checkCapacity, room.checkIsolation and foreign.check. Where the first two refuse
// while claims whose pods are gone are prepared on the same GPUs, it waits (s.mu released)
// until one of those is unprepared or deadline, and checks again; once one was, a server of
// its domain still exiting is no foreign process to refuse for either, until deadline.
// errPrepareAgain: the claim itself was prepared or unprepared meanwhile. Caller holds s.mu.
func (s *State) checkRoom(ctx context.Context, claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice, deadline time.Time) error {
	left := false
	for {
		// Each look after a wait: another claim of the domain may have taken a daemon on the
		// GPU meanwhile (a spare, whose key the planner cannot derive), which the isolation
		// check must see as the domain's.
		s.sameDomainDaemons(planned)
		err := s.room.checkCapacity(claim, planned)
		if err == nil {
			err = s.room.checkIsolation(claim, planned)
		}
		if err == nil {
			err = s.foreign.check(ctx, claim, planned)
			if err == nil || !left || !s.await(ctx, deadline, nil) {
				return err
			}
		} else {
			leaving := s.room.leavingNextTo(claim, planned)
			if len(leaving) == 0 || !s.await(ctx, deadline, leaving) {
				return err
			}
			left = true
		}
		if _, ok := s.cp.Claims[string(claim.UID)]; ok {
			return errPrepareAgain
		}
	}
}

// await releases s.mu until one of the claims uids is unprepared, or for a moment where
// uids is empty (true); false at deadline or ctx. Caller holds s.mu, held again on return.
func (s *State) await(ctx context.Context, deadline time.Time, uids []string) bool {
	for time.Now().Before(deadline) {
		s.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
		s.mu.Lock()
		if ctx.Err() != nil {
			return false
		}
		if len(uids) == 0 || slices.ContainsFunc(uids, func(uid string) bool { _, ok := s.cp.Claims[uid]; return !ok }) {
			return true
		}
	}
	return false
}

// Unprepare undoes Prepare; a claim that is not prepared is not an error.
func (s *State) Unprepare(ctx context.Context, uid string) error {
	s.mu.Lock()
	defer s.unlock(ctx)
	return s.rollback(ctx, uid, true)
}

// rollback removes a claim's spec, then its entry, then its daemons that no one uses any
// more (with release, s.mu is released while they stop: daemons.stopUnused). Each step is
// idempotent, so a crash between them is finished by the next call or by recover.
func (s *State) rollback(ctx context.Context, uid string, release bool) error {
	if _, ok := s.cp.Claims[uid]; !ok {
		s.daemons.retryStops(ctx, release)
		return nil
	}
	if err := s.cdi.Remove(uid); err != nil {
		return err
	}
	entry := s.cp.Claims[uid]
	delete(s.cp.Claims, uid)
	if err := s.save(); err != nil {
		s.cp.Claims[uid] = entry
		return err
	}
	s.caps.unlimitPods(ctx, entry)
	var own []string
	for _, p := range entry.Devices {
		if p.MPSKey != "" {
			own = append(own, p.MPSKey)
		}
	}
	err := s.daemons.release(ctx, own, release)
	// Those it still uses may have lost their last client that a drain evicts.
	s.guards.markClaim(entry)
	return err
}

func pluginDevices(e *checkpoint.ClaimEntry) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(e.Devices))
	for _, p := range e.Devices {
		d := kubeletplugin.Device{Requests: []string{p.Request}, PoolName: p.Pool, DeviceName: p.Device, CDIDeviceIDs: p.CDIDeviceIDs}
		if p.ShareID != "" {
			d.ShareID = ptr.To(types.UID(p.ShareID))
		}
		out = append(out, d)
	}
	return out
}

// PreparedClaims returns a copy of the checkpoint's entries, for status and metrics.
func (s *State) PreparedClaims() map[string]checkpoint.ClaimEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]checkpoint.ClaimEntry, len(s.cp.Claims))
	for uid, e := range s.cp.Claims {
		out[uid] = *e
	}
	return out
}

// unlock releases s.mu and brings the eviction guards of the daemons the transaction
// touched up to date, without it (daemonGuards.unlock).
func (s *State) unlock(ctx context.Context) { s.guards.unlock(ctx) }

// CheckMPS asks fgpu's MPS daemons of prepared claims whether they serve them, restarts
// those dead, and returns the daemons whose clients lost their server (daemons.check).
func (s *State) CheckMPS(ctx context.Context) []MPSFault { return s.daemons.check(ctx) }

// RefreshForeign looks again at the GPUs fgpu has nothing prepared on and returns what
// changed since the last call. A GPU whose foreign processes went gets the compute mode fgpu
// found on it back, if fgpu still holds it changed.
func (s *State) RefreshForeign(ctx context.Context) []ForeignChange {
	// Asked without s.mu: a tenant's control socket can make its daemon's answer wait.
	servers := s.foreign.ownServerPIDs(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.foreign.refresh(ctx, servers, s.Devices(), func(d gpu.Device) {
		if err := s.modes.sync(ctx, d.UUID); err != nil {
			klog.FromContext(ctx).Error(err, "Restoring the compute mode of a GPU whose foreign processes exited", "device", d.Name())
		}
	})
}

// Foreign returns the processes fgpu did not start, by device name, for the slices.
func (s *State) Foreign() map[string][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.foreign.byDevice(s.devices)
}

// CgroupCaps says which devices (by name) cap MPS shares per pod through the cgroup.
func (s *State) CgroupCaps() map[string]bool { return s.caps.byDevice() }
