package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// Processes fgpu did not start.
//
// NVML lists a GPU's compute processes by host PID, and the plugin, outside the host PID
// namespace, cannot tell which container one belongs to. What it knows is what it prepared:
// on a GPU where it has no claim prepared, no MPS server of fgpu's runs and no tenant of
// fgpu's has a container, so every compute process there was started by someone else
// (another device plugin's pod, a host job). Such a GPU is foreign-busy: it is published
// with the taint configapi.ForeignTaintKey, fgpu leaves its compute mode alone, and an MPS
// share that was promised enforced memory is refused there. On a GPU where fgpu has claims
// prepared a new process is taken as its tenants' (its MPS servers and their clients, the
// processes of its time-sliced and whole-GPU claims): the verdict reached before the first
// claim came only shrinks, as the foreign processes it names exit, until the last claim goes.

// The Node events' reasons.
const (
	ReasonForeignProcesses     = "FgpuForeignProcesses"
	ReasonForeignProcessesGone = "FgpuForeignProcessesGone"
)

// ForeignChange is a GPU whose number of processes fgpu did not start changed since the last
// report (a new PID in place of an exited one is no news): PIDs is empty when they are gone.
type ForeignChange struct {
	Device, UUID string
	PIDs         []int
}

// Message says what the change means, for the log and the Node event.
func (c ForeignChange) Message() string {
	if len(c.PIDs) == 0 {
		return fmt.Sprintf("GPU %s (%s) runs no process fgpu did not start any more; it is offered again", c.Device, c.UUID)
	}
	return fmt.Sprintf("GPU %s (%s) runs %d process(es) fgpu did not start; it is not offered until they exit, and fgpu does not change its compute mode",
		c.Device, c.UUID, len(c.PIDs))
}

// foreignWatch is the health applier for processes fgpu did not start: each GPU's verdict,
// and the PIDs of fgpu's own MPS servers, which are not foreign. Its maps are read inside
// the prepare transaction (compute modes, check), so State's lock guards them; the
// daemons are asked for their servers without it.
type foreignWatch struct {
	ownPIDNamespace bool // cfg.OwnPIDNamespace: NVML shows no process of the node
	backend         gpu.Backend
	mps             *mps.Manager
	l               *ledger
	// foreign are the compute processes fgpu did not start, by GPU UUID (see refreshGPU);
	// reported is what refresh last told the driver.
	foreign, reported map[string][]int
	// ownServers are the PIDs of fgpu's MPS servers whose daemons no claim uses any more
	// (leftovers, or stopped and maybe still exiting): NVML may list them on a GPU without
	// claims, and they are not foreign.
	ownServers map[int]bool
	// listErrs is the last error listing each GPU's processes, logged once.
	listErrs map[string]string
}

func newForeignWatch(cfg Config, backend gpu.Backend, m *mps.Manager, l *ledger) *foreignWatch {
	return &foreignWatch{ownPIDNamespace: cfg.OwnPIDNamespace, backend: backend, mps: m, l: l,
		foreign: map[string][]int{}, reported: map[string][]int{}, ownServers: map[int]bool{}, listErrs: map[string]string{}}
}

// refresh looks again at the GPUs devs fgpu has nothing prepared on and returns what
// changed since the last call; servers are fgpu's servers (ownServerPIDs). cleared is called
// for a GPU whose foreign processes went, which gets the compute mode fgpu found on it
// back. Caller holds State's lock.
func (f *foreignWatch) refresh(ctx context.Context, servers []int, devs []gpu.Device, cleared func(d gpu.Device)) []ForeignChange {
	var changes []ForeignChange
	f.own(servers)
	listed := map[int]bool{}
	for _, d := range devs {
		for _, pid := range f.refreshGPU(ctx, d.UUID, "") {
			listed[pid] = true
		}
		now, before := f.foreign[d.UUID], f.reported[d.UUID]
		if len(now) == len(before) {
			continue
		}
		f.reported[d.UUID] = now
		changes = append(changes, ForeignChange{Device: d.Name(), UUID: d.UUID, PIDs: now})
		if len(now) == 0 {
			cleared(d)
		}
	}
	// A server of fgpu's that no GPU lists any more has exited; its PID may be reused.
	maps.DeleteFunc(f.ownServers, func(pid int, _ bool) bool { return !listed[pid] })
	return changes
}

// own records PIDs of fgpu's MPS servers. Caller holds State's lock.
func (f *foreignWatch) own(pids []int) {
	for _, pid := range pids {
		f.ownServers[pid] = true
	}
}

// busy are the processes fgpu did not start on GPU uuid. Caller holds State's lock.
func (f *foreignWatch) busy(uuid string) []int { return f.foreign[uuid] }

// ownServerPIDs are the servers of every daemon fgpu runs: those of prepared claims (a
// GPU's verdict is made afresh when a restart finds it with none), one a gone or rolled back
// claim left behind, and one whose stop failed. None of them is foreign. The daemons are
// asked concurrently, so that one that does not answer delays no other; the caller need not
// hold State's lock, and should not.
func (f *foreignWatch) ownServerPIDs(ctx context.Context) []int {
	if f.ownPIDNamespace {
		return nil
	}
	// Only a daemon with a directory can be asked for its servers.
	keys, err := f.mps.DirKeys()
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing the MPS daemons")
		return nil
	}
	servers := make([][]int, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { servers[i] = f.serversOf(ctx, k) })
	}
	wg.Wait()
	return slices.Concat(servers...)
}

// serversOf are the servers of daemon key, which is about to stop or left over. A daemon
// that does not answer has no server to remember. It asks the daemon: the caller need not
// hold State's lock, and should not.
func (f *foreignWatch) serversOf(ctx context.Context, key string) []int {
	if f.ownPIDNamespace || !f.mps.Running(ctx, key) {
		return nil
	}
	pids, err := f.mps.ServerPIDs(ctx, key)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Its server processes may be taken for foreign ones until they exit", "daemon", key)
	}
	return pids
}

// byDevice returns the processes fgpu did not start, by device name, for the slices.
// Caller holds State's lock.
func (f *foreignWatch) byDevice(devices map[string]gpu.Device) map[string][]int {
	out := map[string][]int{}
	for _, d := range devices {
		if pids := f.foreign[d.UUID]; len(pids) > 0 {
			out[d.Name()] = slices.Clone(pids)
		}
	}
	return out
}

// refreshGPU updates the GPU's verdict. On a GPU where a claim other than except is
// prepared, a new process is taken as fgpu's tenants', so the verdict only shrinks there: the
// foreign processes that exited drop out of it. A failed query keeps the last verdict: it is
// no news about the processes.
// It returns the GPU's processes as listed (nil when not listed).
// Caller holds State's lock (or owns the state exclusively).
func (f *foreignWatch) refreshGPU(ctx context.Context, uuid, except string) []int {
	if f.ownPIDNamespace {
		return nil
	}
	claimed := f.l.claimedOn(uuid, except)
	if claimed && len(f.foreign[uuid]) == 0 {
		return nil
	}
	listed, err := f.backend.ComputeProcesses(uuid)
	if err != nil {
		// Once per GPU and error: a driver that cannot list fails the same way every poll.
		if f.listErrs[uuid] != err.Error() {
			klog.FromContext(ctx).Error(err, "Listing the compute processes of a GPU; its last verdict stands", "gpu", uuid)
			f.listErrs[uuid] = err.Error()
		}
		return nil
	}
	if _, failed := f.listErrs[uuid]; failed {
		klog.FromContext(ctx).Info("Listing the compute processes of a GPU works again", "gpu", uuid)
		delete(f.listErrs, uuid)
	}
	pids := slices.DeleteFunc(slices.Clone(listed), func(pid int) bool {
		if f.ownServers[pid] {
			return true
		}
		_, found := slices.BinarySearch(f.foreign[uuid], pid)
		return claimed && !found
	})
	slices.Sort(pids)
	f.foreign[uuid] = slices.Compact(pids)
	return listed
}

// check looks at the claim's GPUs afresh (the poll may not have seen a process yet)
// and refuses a share promised enforced memory on one that runs processes fgpu did not
// start: its caps hold only while fgpu's MPS server alone uses the GPU in EXCLUSIVE_PROCESS,
// and fgpu does not change that GPU's mode. Other shares are prepared; the GPU keeps its mode.
// Caller holds State's lock.
func (f *foreignWatch) check(ctx context.Context, claim *resourceapi.ResourceClaim, planned []checkpoint.PreparedDevice) error {
	for _, uuid := range slices.Sorted(maps.Keys(gpusOf(planned))) {
		f.refreshGPU(ctx, uuid, string(claim.UID))
	}
	for _, p := range planned {
		pids := f.foreign[p.GPUUUID]
		if len(pids) == 0 || !p.MemoryEnforced {
			continue
		}
		return refused(p.Device, p.ShareID, configapi.PrepareReasonIsolationConflict, fmt.Errorf("refusing to prepare claim %s/%s on GPU %s (%s): it runs %d process(es) fgpu did not start, and the claim's memory caps hold only while its MPS server alone uses the GPU",
			claim.Namespace, claim.Name, p.Device, p.GPUUUID, len(pids)))
	}
	return nil
}

func gpusOf(planned []checkpoint.PreparedDevice) map[string]bool {
	out := map[string]bool{}
	for _, p := range planned {
		out[p.GPUUUID] = true
	}
	return out
}
