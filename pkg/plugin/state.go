package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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
	"github.com/fgpu-dev/fgpu/pkg/dmem"
	"github.com/fgpu-dev/fgpu/pkg/driverroot"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// State is the node's prepared claims and what they hold: the checkpoint, the CDI specs and
// the MPS daemons. Every method keeps the three consistent, also across a crash.
type State struct {
	cfg     Config
	backend gpu.Backend
	devices map[string]gpu.Device // by device name
	store   *checkpoint.Store
	cdi     *cdi.Writer
	mps     *mps.Manager
	// client records Node events; nil outside a cluster.
	client kubernetes.Interface

	mu sync.Mutex
	cp *checkpoint.Checkpoint
	// foreign are the compute processes fgpu did not start, by GPU UUID (see refreshForeign);
	// reported is what RefreshForeign last told the driver.
	foreign, reported map[string][]int
	// ownServers are the PIDs of fgpu's MPS servers whose daemons no claim uses any more
	// (leftovers, or stopped and maybe still exiting): NVML may list them on a GPU without
	// claims, and they are not foreign.
	ownServers map[int]bool
	// listErrs is the last error listing each GPU's processes, logged once.
	listErrs map[string]string
	// diedUnder are the MPS daemons the plugin found dead while claims were prepared on
	// them (at its start, or mpsDeadChecks checks in a row), with those claims: their
	// clients lost their server, and the restarted daemon does not make them whole
	// (CheckMPS reports them until those claims are unprepared).
	diedUnder map[string]map[string]bool
	// unanswered counts each daemon's failed checks in a row (CheckMPS).
	unanswered map[string]int
	// unstopped are the daemons no claim uses that are still to be stopped (their last stop
	// failed, or an unprepare found them left over); sweep says a listing of the daemons
	// failed. The claim whose unprepare failed is gone from the checkpoint, so its retry and
	// CheckMPS try again (retryStops).
	unstopped map[string]bool
	sweep     bool
	// pods is the node's pod watch (nil without it): where its pods are gone, a prepared
	// claim is about to be unprepared (checkRoom).
	pods corelisters.PodLister
	// guards are the MPS daemons whose eviction guard may have to change (guardDaemon),
	// brought up to date by unlock, without s.mu, one caller at a time (guardRounds).
	guards      map[string]bool
	guardRounds rounds

	// cgroups is the node's cgroup v2 root; dmemRegions the dmem region of each GPU (by UUID)
	// whose memory it partitions (see detectCgroupCaps).
	cgroups     dmem.Root
	dmemRegions map[string]string
	// background outlives a prepare call (a pod cgroup awaited); podEvent records a pod event;
	// capChanged republishes the status of a prepared claim whose memoryCap changed.
	background context.Context
	podEvent   func(ctx context.Context, ns string, pod checkpoint.PodRef, reason, msg string)
	capChanged func(ctx context.Context, ns, name, uid string)
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
	s := &State{
		cfg: cfg, backend: backend, devices: map[string]gpu.Device{},
		store:   checkpoint.NewStore(cfg.CheckpointPath()),
		cdi:     w,
		mps:     &mps.Manager{Root: cfg.MPSRoot, Binary: backend.MPSControlBinary()},
		client:  client,
		foreign: map[string][]int{}, reported: map[string][]int{}, ownServers: map[int]bool{}, listErrs: map[string]string{}, diedUnder: map[string]map[string]bool{}, unanswered: map[string]int{}, unstopped: map[string]bool{},
		background: ctx,
	}
	if b, ok := backend.(interface{ MPSDaemonEnv(string) []string }); ok {
		s.mps.DaemonEnv = b.MPSDaemonEnv
	}
	switch pc := cfg.MPSPods; {
	case cfg.MPSLauncher != nil:
		s.mps.Launcher = cfg.MPSLauncher
		s.mps.ShmSize = pc.ShmSize
	case pc.Image != "":
		if client == nil {
			return nil, errors.New("MPS daemons in pods need an API client")
		}
		s.mps.Launcher = &mps.PodLauncher{Client: client, Namespace: pc.Namespace, NodeName: cfg.NodeName,
			Image: pc.Image, PullPolicy: pc.PullPolicy, DriverRoot: pc.DriverRoot, HostPaths: pc.HostPaths,
			ServiceAccount: pc.ServiceAccount, PriorityClass: pc.PriorityClass}
		s.mps.ShmSize = pc.ShmSize
	}
	// Before the first control command: none may follow a symlink a tenant put in its
	// pipe directory.
	if err := s.mps.OpenControlView(); err != nil {
		return nil, err
	}
	for _, d := range devs {
		s.devices[d.Name()] = d
	}
	s.detectCgroupCaps(ctx)
	if err := s.loadOrRebuild(ctx, client); err != nil {
		return nil, err
	}
	// Before recover sets any compute mode: a GPU busy with someone else's work keeps its own.
	// The servers of daemons recover stops are fgpu's, not someone else's.
	for _, pid := range s.ownServerPIDs(ctx) {
		s.ownServers[pid] = true
	}
	for _, d := range s.devices {
		s.refreshForeign(ctx, d.UUID, "")
	}
	if err := s.recover(ctx); err != nil {
		return nil, fmt.Errorf("recover prepared claims: %w", err)
	}
	s.mu.Lock()
	s.unlock(ctx) // the guards of the daemons recover adopted or started
	return s, nil
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
	if err := s.refusedBefore(claim); err != nil {
		return nil, err
	}
	planned, err := s.plan(claim)
	if err == nil {
		err = s.checkRoom(ctx, claim, planned, deadline)
	}
	if errors.Is(err, errPrepareAgain) {
		return nil, err
	}
	if err != nil {
		s.rememberRefusal(ctx, claim, err)
		return nil, err
	}
	entry := &checkpoint.ClaimEntry{Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareStarted, Devices: planned, Pods: pods}
	s.cp.Claims[uid] = entry
	if err := s.store.Save(s.cp); err != nil {
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
	if err := s.store.Save(s.cp); err != nil {
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
	if err := s.store.Save(s.cp); err != nil {
		e.Pods = e.Pods[:len(e.Pods)-len(added)]
		return err
	}
	s.limitPods(ctx, e, added)
	s.guardDaemons(ctx, e)
	return nil
}

// apply performs the side effects of a PrepareStarted entry. With release, s.mu is released
// while an MPS daemon starts (see ensureDaemon); the entry is then checked to be still the
// claim's.
func (s *State) apply(ctx context.Context, uid string, e *checkpoint.ClaimEntry, release bool) error {
	var specs []cdi.Device
	for i := range e.Devices {
		p := &e.Devices[i]
		if p.MPSKey != "" || p.Mode == string(configapi.SharingModeTimeSlicing) {
			if err := s.syncComputeMode(ctx, p.GPUUUID); err != nil {
				return err
			}
		}
		if p.MPSKey != "" {
			started, err := s.ensureDaemon(ctx, p.MPSKey, p.GPUUUID, release)
			if started {
				s.daemonWasDown(ctx, p, uid)
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
	s.limitPods(ctx, e, e.Pods)
	for i := range e.Devices {
		specs = append(specs, s.cdiDevice(&e.Devices[i], i, len(e.Devices)))
	}
	ids, err := s.cdi.Write(uid, specs)
	if err != nil {
		return err
	}
	for i := range e.Devices {
		e.Devices[i].CDIDeviceIDs = []string{ids[i]}
	}
	return nil
}

// ensureDaemon starts or adopts an MPS daemon with its domain's defaults; started says it
// was started anew (mps.Manager.Ensure). The caller holds s.mu; with release, s.mu is
// released meanwhile: a start may take StartTimeout and more (a tenant can wedge its own
// domain's daemon), and no other domain's prepare, unprepare or check may wait for it.
// mps.Manager serialises the calls for one daemon, and the defaults are applied again when
// the domain's claims changed meanwhile, so that the last caller leaves the current ones.
func (s *State) ensureDaemon(ctx context.Context, key, gpuUUID string, release bool) (started bool, err error) {
	limits := s.domainLimits(key)
	if !release {
		started, err = s.mps.Ensure(ctx, key, gpuUUID, limits)
		if err == nil {
			s.guardDaemon(ctx, key)
		}
		return started, err
	}
	for {
		s.mu.Unlock()
		st, err := s.mps.Ensure(ctx, key, gpuUUID, limits)
		s.mu.Lock()
		started = started || st
		if err != nil {
			return started, err
		}
		now := s.domainLimits(key)
		if now == limits {
			s.guardDaemon(ctx, key)
			return started, nil
		}
		limits = now
	}
}

// domainLimits are the MPS server defaults for a daemon: the largest caps among its
// tenants, so a client that drops its own limits still cannot take more than any tenant
// of its domain was given.
func (s *State) domainLimits(key string) mps.Limits {
	var l mps.Limits
	for _, e := range s.cp.Claims {
		for _, p := range e.Devices {
			if p.MPSKey != key {
				continue
			}
			l.PinnedMemBytes = max(l.PinnedMemBytes, p.MemoryLimitBytes)
			thread := p.ThreadPercent
			if thread == 0 {
				thread = 100
			}
			l.ThreadPercent = max(l.ThreadPercent, thread)
		}
	}
	return l
}

// checkCapacity is the last line of defence against over-commit: the API server checks no
// capacity, so an allocation written by anyone is re-checked against what this node holds.
func (s *State) checkCapacity(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) error {
	for _, p := range planned {
		d := s.devices[p.Device]
		allocatable := AllocatableMemory(d, s.cfg.ReservedMemory)
		usedMem, usedCompute, tenants := int64(0), int64(0), 0
		for uid, e := range s.cp.Claims {
			if uid == string(claim.UID) {
				continue
			}
			for _, q := range e.Devices {
				if q.Device == p.Device {
					usedMem += q.MemoryBytes
					usedCompute += q.ComputePercent
					tenants++
				}
			}
		}
		if usedMem+p.MemoryBytes > allocatable {
			return refused(p.Device, p.ShareID, configapi.PrepareReasonOverCommitted, fmt.Errorf("refusing to over-commit GPU %s (%s): claim %s/%s asks %s memory, %s of %s allocatable is already prepared for %d other claim(s)",
				p.Device, d.UUID, claim.Namespace, claim.Name, bytesStr(p.MemoryBytes), bytesStr(usedMem), bytesStr(allocatable), tenants))
		}
		if usedCompute+p.ComputePercent > 100 {
			return refused(p.Device, p.ShareID, configapi.PrepareReasonOverCommitted, fmt.Errorf("refusing to over-commit GPU %s (%s): claim %s/%s asks %d%% compute, %d%% of 100%% is already prepared for %d other claim(s)",
				p.Device, d.UUID, claim.Namespace, claim.Name, p.ComputePercent, usedCompute, tenants))
		}
	}
	return nil
}

// checkIsolation refuses a share that would put a second isolation domain on a GPU where one
// of them must be alone: a claim told FGPU_MEMORY_ENFORCED=true (MPS on a placement that keeps
// the GPU to its domain) is capped only while its MPS server is the only user of the GPU
// (EXCLUSIVE_PROCESS). Another domain's MPS server or time-sliced processes would drop the
// GPU to the default compute mode, where a process that bypasses MPS is not capped. Whoever
// wrote the allocation (a deposed allocator, a lagging informer), the plugin keeps that
// promise. The message names no other claim: it is recorded on this claim, which another
// namespace may own.
func (s *State) checkIsolation(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) error {
	for _, p := range planned {
		if !sharedMode(p.Mode) {
			continue
		}
		for uid, e := range s.cp.Claims {
			if uid == string(claim.UID) {
				continue
			}
			for _, q := range e.Devices {
				if q.Device != p.Device || !sharedMode(q.Mode) || q.MPSKey == p.MPSKey || (!p.MemoryEnforced && !q.MemoryEnforced) {
					continue
				}
				keeps := "that share's placement keeps the GPU to its own domain"
				if p.MemoryEnforced {
					keeps = "the claim's placement keeps the GPU to its own domain"
				}
				return refused(p.Device, p.ShareID, configapi.PrepareReasonIsolationConflict, fmt.Errorf("refusing to put a second isolation domain on GPU %s (%s): claim %s/%s (%s, domain %s) would share it with another domain's %s share, and %s",
					p.Device, s.devices[p.Device].UUID, claim.Namespace, claim.Name, p.Mode, p.IsolationDomain, q.Mode, keeps))
			}
		}
	}
	return nil
}

// usePodWatch gives the state the node's pod watch, for checkRoom.
func (s *State) usePodWatch(l corelisters.PodLister) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pods = l
}

// unprepareWait is how long a prepare that other prepared claims refuse waits for those of
// them whose pods are gone to be unprepared: the allocator frees a share once its pod is
// done or its claim deleted, which can come a moment before the kubelet unprepares the claim,
// and a refusal would cost the new pod the allocator's bind timeout and the kubelet's retry.
const unprepareWait = 10 * time.Second

// checkRoom is checkCapacity, checkIsolation and checkForeign. Where the first two refuse
// while claims whose pods are gone are prepared on the same GPUs, it waits (s.mu released)
// until one of those is unprepared or deadline, and checks again; once one was, a server of
// its domain still exiting is no foreign process to refuse for either, until deadline.
// errPrepareAgain: the claim itself was prepared or unprepared meanwhile. Caller holds s.mu.
func (s *State) checkRoom(ctx context.Context, claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice, deadline time.Time) error {
	left := false
	for {
		err := s.checkCapacity(claim, planned)
		if err == nil {
			err = s.checkIsolation(claim, planned)
		}
		if err == nil {
			err = s.checkForeign(ctx, claim, planned)
			if err == nil || !left || !s.await(ctx, deadline, nil) {
				return err
			}
		} else {
			leaving := s.leavingNextTo(claim, planned)
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

// leavingNextTo are the other claims prepared on the planned GPUs whose pods are all gone
// from this node's API view (deleted, replaced or finished): the kubelet is about to
// unprepare them. Unknown without the node's pod watch. Caller holds s.mu.
func (s *State) leavingNextTo(claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) []string {
	if s.pods == nil {
		return nil
	}
	var out []string
	for uid, e := range s.cp.Claims {
		if uid == string(claim.UID) || len(e.Pods) == 0 || !slices.ContainsFunc(e.Devices, func(q checkpoint.PreparedDevice) bool {
			return slices.ContainsFunc(planned, func(p checkpoint.PreparedDevice) bool { return p.Device == q.Device })
		}) {
			continue
		}
		if !slices.ContainsFunc(e.Pods, func(ref checkpoint.PodRef) bool { return s.podRuns(e.Namespace, ref) }) {
			out = append(out, uid)
		}
	}
	return out
}

// podRuns reports whether the node's pod watch still shows the pod, not deleted or finished.
func (s *State) podRuns(ns string, ref checkpoint.PodRef) bool {
	p, err := s.pods.Pods(ns).Get(ref.Name)
	return err == nil && string(p.UID) == ref.UID && p.DeletionTimestamp == nil &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
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

// sharedMode: a share that others may use the GPU next to (not a whole GPU).
func sharedMode(mode string) bool {
	return mode == string(configapi.SharingModeMPS) || mode == string(configapi.SharingModeTimeSlicing)
}

// maxRefusals bounds the checkpoint's refused allocations; the oldest go first. A claim's
// refusals also go when the claim comes back with another allocation.
const maxRefusals = 512

// refusedBefore returns the refusal recorded for one of the claim's current allocation
// results, so that the same allocation is refused on every retry: the allocator acts on the
// refusal condition whenever it sees it, so a share prepared after it would be taken back
// from a running pod. Refusals of the claim's earlier allocations are forgotten: a new
// allocation is judged afresh.
func (s *State) refusedBefore(claim *resourceapi.ResourceClaim) error {
	uid := string(claim.UID)
	var found error
	kept := s.cp.Refused[:0]
	for _, r := range s.cp.Refused {
		if r.ClaimUID == uid && !s.allocates(claim, r) {
			continue
		}
		kept = append(kept, r)
		if r.ClaimUID == uid && found == nil {
			found = refused(r.Device, r.ShareID, r.Reason, errors.New(r.Message))
		}
	}
	s.cp.Refused = kept
	return found
}

func (s *State) allocates(claim *resourceapi.ResourceClaim, r checkpoint.Refusal) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, res := range claim.Status.Allocation.Devices.Results {
		if res.Driver == s.cfg.DriverName && res.Pool == r.Pool && res.Device == r.Device && shareOf(res) == r.ShareID {
			return true
		}
	}
	return false
}

// rememberRefusal records a prepare refused for a reason the allocator acts on, of a claim
// the allocator will place again (placedAgain). For any other claim a retry may find room.
func (s *State) rememberRefusal(ctx context.Context, claim *resourceapi.ResourceClaim, err error) {
	var rf *refusal
	if !s.placedAgain(claim) || !errors.As(err, &rf) {
		return
	}
	s.cp.Refused = append(s.cp.Refused, checkpoint.Refusal{ClaimUID: string(claim.UID), Pool: s.cfg.NodeName,
		Device: rf.device, ShareID: rf.shareID, Reason: rf.reason, Message: rf.Error()})
	if n := len(s.cp.Refused) - maxRefusals; n > 0 {
		s.cp.Refused = slices.Delete(s.cp.Refused, 0, n)
	}
	if err := s.store.Save(s.cp); err != nil {
		// Still refused until the plugin restarts.
		klog.FromContext(ctx).Error(err, "Recording a refused prepare in the checkpoint", "claim", klog.KObj(claim))
	}
}

// placedAgain says whether the allocator takes the claim back and places it again when its
// prepare is refused: in allocator mode, a claim it placed (api.PlacedByAllocator). Nothing
// places a claim kube-scheduler allocated (in scheduler mode, or before a switch to
// allocator mode) again, so its refusal is not kept: a retry prepares it once there is room.
func (s *State) placedAgain(claim *resourceapi.ResourceClaim) bool {
	return s.cfg.Fenced && configapi.PlacedByAllocator(s.cfg.DriverName, claim)
}

// Unprepare undoes Prepare; a claim that is not prepared is not an error.
func (s *State) Unprepare(ctx context.Context, uid string) error {
	s.mu.Lock()
	defer s.unlock(ctx)
	return s.rollback(ctx, uid, true)
}

// rollback removes a claim's spec, then its entry, then its daemons that no one uses any
// more (with release, s.mu is released while they stop: stopUnusedDaemons). Each step is
// idempotent, so a crash between them is finished by the next call or by recover.
func (s *State) rollback(ctx context.Context, uid string, release bool) error {
	if _, ok := s.cp.Claims[uid]; !ok {
		s.retryStops(ctx, release)
		return nil
	}
	if err := s.cdi.Remove(uid); err != nil {
		return err
	}
	entry := s.cp.Claims[uid]
	delete(s.cp.Claims, uid)
	if err := s.store.Save(s.cp); err != nil {
		s.cp.Claims[uid] = entry
		return err
	}
	s.unlimitPods(ctx, entry)
	var own []string
	for _, p := range entry.Devices {
		if p.MPSKey != "" {
			own = append(own, p.MPSKey)
		}
	}
	// Only the claim's own daemons are stopped here: a daemon left over by another domain
	// (its stop failed, or is under way) may take a command timeout to stop, and this
	// unprepare must not wait for it. The MPS check stops those.
	all, listErr := s.mps.Keys(ctx)
	if listErr != nil {
		s.sweep = true
	}
	used := s.usedDaemons()
	for _, k := range all {
		if !used[k] && !slices.Contains(own, k) {
			s.unstopped[k] = true
		}
	}
	err := s.stopUnusedDaemons(ctx, own, release)
	// Those it still uses may have lost their last client that a drain evicts.
	s.guardDaemons(ctx, entry)
	return errors.Join(listErr, err)
}

// stopUnusedDaemons stops those of the daemons keys that no claim uses. The caller holds
// s.mu; with release, s.mu is released while the daemons are asked for their servers and
// stopped: a tenant controls its daemon's control socket and can make each command wait its
// whole timeout, and no other domain's prepare or unprepare may wait for that. They are
// stopped concurrently, so that one domain's slow stop delays no other's, and each only if
// no prepare took it meanwhile. A failed stop is kept in unstopped and tried again.
func (s *State) stopUnusedDaemons(ctx context.Context, keys []string, release bool) error {
	used := s.usedDaemons()
	keys = slices.DeleteFunc(slices.Compact(slices.Sorted(slices.Values(keys))), func(k string) bool {
		if used[k] {
			delete(s.unstopped, k)
		}
		return used[k]
	})
	stillUsed := func(key string) func() bool {
		if !release {
			return nil // s.mu is held throughout
		}
		return func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.usedDaemons()[key]
		}
	}
	servers := make([][]int, len(keys))
	errs := make([]error, len(keys))
	if release && len(keys) > 0 {
		s.mu.Unlock()
	}
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() {
			servers[i] = s.serversOf(ctx, k)
			errs[i] = s.mps.StopUnlessUsed(ctx, k, stillUsed(k))
		})
	}
	wg.Wait()
	if release && len(keys) > 0 {
		s.mu.Lock()
	}
	for i, k := range keys {
		for _, pid := range servers[i] {
			s.ownServers[pid] = true
		}
		if errs[i] != nil {
			s.unstopped[k] = true
		} else {
			delete(s.unstopped, k)
		}
	}
	for _, d := range s.devices {
		errs = append(errs, s.syncComputeMode(ctx, d.UUID))
	}
	return errors.Join(errs...)
}

// usedDaemons are the daemons of the checkpoint's claims. Caller holds s.mu.
func (s *State) usedDaemons() map[string]bool {
	used := map[string]bool{}
	for _, e := range s.cp.Claims {
		for _, p := range e.Devices {
			if p.MPSKey != "" {
				used[p.MPSKey] = true
			}
		}
	}
	return used
}

// retryStops stops the daemons no claim uses that are still to be stopped (unstopped, and
// after a failed listing all of them), as stopUnusedDaemons does. A failure is only logged:
// the caller's claim is not the one that holds them.
func (s *State) retryStops(ctx context.Context, release bool) {
	if s.sweep {
		all, err := s.mps.Keys(ctx)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Listing the MPS daemons to stop those no prepared claim uses; trying again at the next MPS check")
			return
		}
		s.sweep = false
		for _, k := range all {
			s.unstopped[k] = true
		}
	}
	if len(s.unstopped) == 0 {
		return
	}
	if err := s.stopUnusedDaemons(ctx, slices.Collect(maps.Keys(s.unstopped)), release); err != nil {
		klog.FromContext(ctx).Error(err, "Stopping the MPS daemons no prepared claim uses; trying again at the next MPS check")
	}
}

// syncComputeMode puts a GPU in EXCLUSIVE_PROCESS while exactly one MPS server (one
// isolation domain) and nothing else uses it, so nothing but that server can open it.
// Servers of several domains on one GPU need the default mode: they time-slice the GPU
// between them; so do time-sliced claims, whose processes are not MPS clients (in scheduler
// mode kube-scheduler may put one next to an MPS share). checkIsolation keeps both off a GPU
// whose MPS share was told its memory is enforced.
//
// fgpu changes only what it needs and gives back what it found: the first change records
// the GPU's mode in the checkpoint, and when fgpu's last claim on the GPU goes that mode is
// restored. A GPU fgpu has not changed is not touched (an admin's mode stays), nor is one
// that holds only whole-GPU claims, nor one that runs processes fgpu did not start: changing its mode could lock them or fgpu's MPS
// server out.
func (s *State) syncComputeMode(ctx context.Context, uuid string) error {
	used, domains, timeSliced := false, map[string]bool{}, false
	for _, e := range s.cp.Claims {
		for _, p := range e.Devices {
			if p.GPUUUID != uuid {
				continue
			}
			used = true
			switch {
			case p.MPSKey != "":
				domains[p.MPSKey] = true
			case p.Mode == string(configapi.SharingModeTimeSlicing):
				timeSliced = true
			}
		}
	}
	found, changed := s.cp.FoundComputeModes[uuid]
	if !used && !changed {
		return nil
	}
	if used && len(domains) == 0 && !timeSliced {
		// Whole-GPU claims only: fgpu wants no mode there, and the tenant may rely on the one it has.
		return nil
	}
	if pids := s.foreign[uuid]; len(pids) > 0 {
		klog.FromContext(ctx).V(2).Info("Leaving the compute mode of a GPU that runs processes fgpu did not start", "gpu", uuid, "pids", pids)
		return nil
	}
	want := gpu.ComputeMode(found)
	if used {
		want = gpu.ComputeModeDefault
		if len(domains) == 1 && !timeSliced {
			want = gpu.ComputeModeExclusiveProcess
		}
	}
	current, err := s.computeMode(uuid)
	if err != nil {
		return err
	}
	if current != want {
		if !changed {
			if s.cp.FoundComputeModes == nil {
				s.cp.FoundComputeModes = map[string]string{}
			}
			// Saved before the change, so that a crash right after it still restores the mode.
			s.cp.FoundComputeModes[uuid] = string(current)
			if err := s.store.Save(s.cp); err != nil {
				delete(s.cp.FoundComputeModes, uuid)
				return err
			}
		}
		if err := s.backend.SetComputeMode(uuid, want); err != nil {
			return fmt.Errorf("set compute mode of GPU %s to %s: %w", uuid, want, err)
		}
	}
	if !used {
		delete(s.cp.FoundComputeModes, uuid)
		if err := s.store.Save(s.cp); err != nil {
			// The mode is back; a later sync finds it so and forgets it then.
			klog.FromContext(ctx).Error(err, "Forgetting a restored compute mode", "gpu", uuid)
		}
	}
	return nil
}

func (s *State) computeMode(uuid string) (gpu.ComputeMode, error) {
	devs, err := s.backend.Devices()
	if err != nil {
		return "", fmt.Errorf("read compute mode of GPU %s: %w", uuid, err)
	}
	for _, d := range devs {
		if d.UUID == uuid {
			return d.ComputeMode, nil
		}
	}
	return "", fmt.Errorf("GPU %s is gone", uuid)
}

// recover makes disk and processes match the checkpoint after a restart: half-prepared
// claims are rolled back (the kubelet retries them), specs and daemons that no entry
// accounts for are removed, and daemons that prepared claims need are running.
func (s *State) recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for uid, e := range s.cp.Claims {
		if e.State != checkpoint.PrepareCompleted {
			logger.Info("Rolling back a claim whose prepare was interrupted", "claim", klog.KRef(e.Namespace, e.Name), "uid", uid)
			if err := s.rollback(ctx, uid, false); err != nil {
				return err
			}
		}
	}
	uids, err := s.cdi.ClaimUIDs()
	if err != nil {
		return err
	}
	for _, uid := range uids {
		if _, ok := s.cp.Claims[uid]; !ok {
			logger.Info("Removing a CDI spec no prepared claim accounts for", "uid", uid)
			if err := s.cdi.Remove(uid); err != nil {
				return err
			}
		}
	}
	// Every daemon present: also those that no entry accounts for.
	keys, err := s.mps.Keys(ctx)
	if err != nil {
		return err
	}
	if err := s.stopUnusedDaemons(ctx, keys, false); err != nil {
		return err
	}
	// The daemons prepared claims use are adopted as they run; only one that is gone (or
	// runs without answering) is started again, and its claims' pods moved: daemonWasDown.
	checked := map[string]bool{}
	for uid, e := range s.cp.Claims {
		// Idempotent: a pod whose cgroup appeared while the plugin was down gets its caps now.
		s.limitPods(ctx, e, e.Pods)
		for i := range e.Devices {
			p := &e.Devices[i]
			if p.MPSKey == "" || checked[p.MPSKey] {
				continue
			}
			checked[p.MPSKey] = true
			// One unanswered question is no dead daemon (a loaded node answers late): only a
			// daemon that had to be started anew lost its clients.
			started, err := s.ensureDaemon(ctx, p.MPSKey, p.GPUUUID, false)
			if started {
				s.daemonWasDown(ctx, p, "")
				logger.Info("Started the MPS daemon of a prepared claim again", "claim", klog.KRef(e.Namespace, e.Name), "uid", uid, "daemon", p.MPSKey)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// ReasonMPSDaemonRestarted is the Node event of an MPS daemon that prepared claims used and
// that was found stopped.
const ReasonMPSDaemonRestarted = "FgpuMPSDaemonRestarted"

// daemonWasDown reports an MPS daemon found not running while prepared claims other than
// claim uid use it: a tenant quit it, or its pod died or was deleted. Their running CUDA
// processes lost their server.
func (s *State) daemonWasDown(ctx context.Context, p *checkpoint.PreparedDevice, uid string) {
	var users int
	for u, e := range s.cp.Claims {
		// A claim still being prepared (the kubelet prepares claims concurrently) has given
		// no container the daemon yet: its processes lost nothing.
		if u == uid || e.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, q := range e.Devices {
			if q.MPSKey == p.MPSKey {
				users++
				// Its pods' CUDA processes lost their server: the MPS check moves them.
				if s.diedUnder[p.MPSKey] == nil {
					s.diedUnder[p.MPSKey] = map[string]bool{}
				}
				s.diedUnder[p.MPSKey][u] = true
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
	if s.client == nil {
		return
	}
	if err := s.nodeEvent(ctx, s.client, corev1.EventTypeWarning, ReasonMPSDaemonRestarted, msg); err != nil {
		logger.Error(err, "Recording a Node event about a stopped MPS daemon")
	}
}

// cdiDevice is what a container of the claim receives for device i of its n devices.
//
// A runtime applies all CDI devices a container names in one pass, and of two devices that set
// one variable the last applied wins. So each device sets only names no other device of the
// claim sets: FGPU_<NAME>_<i> for every claim, and the plain FGPU_<NAME> only in a claim of one
// device, where it cannot be contradicted. A container that names one request of a claim gets
// that request's devices only, and with them exactly their own variables.
func (s *State) cdiDevice(p *checkpoint.PreparedDevice, i, n int) cdi.Device {
	d := s.devices[p.Device]
	dev := cdi.Device{Name: p.Device}
	for _, node := range d.DeviceNodes {
		dev.DeviceNodes = append(dev.DeviceNodes, cdi.DeviceNode{HostPath: node, Path: s.cfg.containerDevicePath(node)})
	}
	for _, v := range []struct{ name, value string }{
		{configapi.EnvGPUUUID, d.UUID},
		{configapi.EnvDevice, p.Device},
		{configapi.EnvShareID, p.ShareID},
		{configapi.EnvSharingMode, p.Mode},
		{configapi.EnvIsolationDomain, p.IsolationDomain},
		{configapi.EnvMemoryLimitBytes, strconv.FormatInt(p.MemoryLimitBytes, 10)},
		{configapi.EnvMemoryLimit, bytesStr(p.MemoryLimitBytes)},
		{configapi.EnvMemoryGuaranteedBytes, strconv.FormatInt(p.MemoryBytes, 10)},
		{configapi.EnvMemoryGuaranteed, bytesStr(p.MemoryBytes)},
		{configapi.EnvComputePercent, strconv.FormatInt(p.ThreadPercent, 10)},
		{configapi.EnvMemoryEnforced, strconv.FormatBool(p.MemoryEnforced)},
		{configapi.EnvMemoryEnforcement, p.MemoryEnforcement},
		{configapi.EnvMemoryCap, p.MemoryCap},
	} {
		if n == 1 {
			dev.Env = append(dev.Env, v.name+"="+v.value)
		}
		dev.Env = append(dev.Env, fmt.Sprintf("%s_%d=%s", v.name, i, v.value))
	}
	// CUDA_MPS_* come from the claim's one MPS share (plan allows no second one).
	if p.MPSKey == "" {
		return dev
	}
	pipe, logDir := s.mps.PipeDir(p.MPSKey), s.mps.LogDir(p.MPSKey)
	dev.Env = append(dev.Env,
		configapi.EnvMPSPipeDirectory+"="+pipe,
		configapi.EnvMPSLogDirectory+"="+logDir,
		fmt.Sprintf("%s=0=%dM", configapi.EnvMPSPinnedDeviceMemLimit, p.MemoryLimitBytes>>20),
	)
	if p.ThreadPercent > 0 {
		dev.Env = append(dev.Env, fmt.Sprintf("%s=%d", configapi.EnvMPSActiveThreadPercentage, p.ThreadPercent))
	}
	dev.Mounts = []cdi.Mount{
		{HostPath: pipe, ContainerPath: pipe, Options: []string{"rw", "nosuid", "nodev", "bind"}},
		{HostPath: logDir, ContainerPath: logDir, Options: []string{"ro", "nosuid", "nodev", "bind"}},
		{HostPath: s.mps.ShmDir(p.MPSKey), ContainerPath: "/dev/shm", Options: []string{"rw", "nosuid", "nodev", "bind"}},
	}
	return dev
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

func (c Config) containerDevicePath(hostPath string) string {
	if c.DevRoot == "" || c.DevRoot == "/dev" {
		return hostPath
	}
	return "/dev/" + strings.TrimPrefix(strings.TrimPrefix(hostPath, c.DevRoot), "/")
}
