package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/dmem"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// ReasonCgroupMemoryNotCapped is the Warning event on a pod whose cgroup did not get its claims'
// GPU memory cap: each of its MPS client processes is still capped, the pod as a whole is not.
const ReasonCgroupMemoryNotCapped = "FgpuCgroupMemoryNotCapped"

// The kubelet makes a pod's cgroup before it prepares the pod's claims (Kubelet.SyncPod, then
// the runtime's SyncPod prepares the claims before the sandbox), so it is normally there; if
// not, it is looked for this long, then the pod gets an event.
const (
	cgroupWait = time.Minute
	cgroupPoll = 500 * time.Millisecond
)

// memoryCaps is the cgroup applier: it caps each pod's GPU memory through its cgroup's
// dmem.max on GPUs the kernel's dmem controller partitions, and tells a claim whose pod
// could not be capped that it is capped per MPS client process only. The caps follow from
// the ledger, so it runs under State's lock (mu), which a pod whose cgroup is awaited
// takes again in the background.
type memoryCaps struct {
	l       *ledger
	mu      *sync.Mutex // State's lock
	devices map[string]gpu.Device
	specs   *cdiSpecs
	// cgroups is the node's cgroup v2 root; regions the dmem region of each GPU (by UUID)
	// whose memory it partitions (see detect).
	cgroups dmem.Root
	regions map[string]string
	// background outlives a prepare call (a pod cgroup awaited); podEvent records a pod event;
	// capChanged republishes the status of a prepared claim whose memoryCap changed. The
	// driver sets both before it serves; without them nothing is told.
	background context.Context
	podEvent   func(ctx context.Context, ns string, pod checkpoint.PodRef, reason, msg string)
	capChanged func(ctx context.Context, ns, name, uid string)
}

// detect finds the GPUs whose memory the kernel's dmem controller partitions: the
// driver lists nvidia/<pci bus id>/vidmem in dmem.capacity of a cgroup v2 root.
func (mc *memoryCaps) detect(ctx context.Context, cgroupRoot string) {
	logger := klog.FromContext(ctx)
	mc.regions = map[string]string{}
	if cgroupRoot == "" {
		return
	}
	mc.cgroups = dmem.Root{Path: cgroupRoot}
	capacity, err := mc.cgroups.Capacity()
	if err != nil {
		logger.Info("GPU memory is capped per MPS client process only: no per-cgroup GPU memory limits", "reason", err.Error())
		return
	}
	for _, d := range mc.devices {
		region := dmem.Region(d.PCIBusID)
		if _, ok := capacity[region]; ok && d.PCIBusID != "" {
			mc.regions[d.UUID] = region
		}
		logger.Info("GPU memory enforcement", "device", d.Name(), "uuid", d.UUID, "memoryCap", memoryCap("mps", mc.regions[d.UUID] != ""), "dmemRegion", region)
	}
}

// byDevice says which devices (by name) cap MPS shares per pod through the cgroup.
func (mc *memoryCaps) byDevice() map[string]bool {
	out := map[string]bool{}
	for name, d := range mc.devices {
		out[name] = mc.regions[d.UUID] != ""
	}
	return out
}

// partitions says whether the dmem controller partitions GPU uuid's memory.
func (mc *memoryCaps) partitions(uuid string) bool { return mc.regions[uuid] != "" }

// active says whether some GPU of the node is capped through the cgroup.
func (mc *memoryCaps) active() bool { return len(mc.regions) > 0 }

// capped says whether the pod cgroup's dmem.max may cap a share: an MPS share of a GPU
// the dmem controller partitions. It does not depend on what the claim reports (MemoryCap),
// so a claim that fell back to mps-per-process still counts in the caps of its capped pods.
func (mc *memoryCaps) capped(p checkpoint.PreparedDevice) bool {
	return p.MPSKey != "" && mc.regions[p.GPUUUID] != ""
}

// limitPod sets the pod's dmem.max on each dmem-partitioned GPU it holds shares of: the sum of
// the limits of its MPS shares there (several claims of one pod on one GPU add up). dmem.max
// charges every process of the pod, so a pod that also holds a share no cgroup limit may cap
// there (time-sliced, whole GPU) gets none on that GPU ("max"). Regions in also get cleared
// where no claim of the pod is left. It returns the regions where the pod is now capped. The
// caller holds mc.mu.
func (mc *memoryCaps) limitPod(uid string, also map[string]bool) (map[string]bool, error) {
	want, uncappable := map[string]int64{}, map[string]bool{}
	for r := range also {
		want[r] = 0
	}
	for _, e := range mc.l.cp.Claims {
		if !hasPod(e, uid) {
			continue
		}
		for _, p := range e.Devices {
			r := mc.regions[p.GPUUUID]
			if r == "" {
				continue
			}
			if _, ok := want[r]; !ok {
				want[r] = 0
			}
			if mc.capped(p) {
				want[r] += p.MemoryLimitBytes
			} else {
				uncappable[r] = true
			}
		}
	}
	capped := map[string]bool{}
	if len(want) == 0 {
		return capped, nil
	}
	cg, err := mc.cgroups.PodCgroup(uid)
	if err != nil {
		return capped, err
	}
	var errs []error
	for r, bytes := range want {
		if uncappable[r] {
			bytes = 0
		}
		err := mc.cgroups.SetMax(cg, r, bytes)
		errs = append(errs, err)
		capped[r] = err == nil && bytes > 0
	}
	return capped, errors.Join(errs...)
}

// limitPods applies the cgroup caps of a prepared claim to some of its pods: a pod whose cgroup
// cannot be limited gets an event, one whose cgroup is not there yet is waited for in the
// background. Every claim of these pods that says cgroup, but has a pod not capped on its GPU
// now, says mps-per-process from then on (settle); so does the entry being applied, which
// the caller writes. The caller holds mc.mu.
func (mc *memoryCaps) limitPods(ctx context.Context, e *checkpoint.ClaimEntry, pods []checkpoint.PodRef) {
	if !slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return mc.regions[p.GPUUUID] != "" }) {
		return
	}
	capped := map[string]map[string]bool{}
	for _, pod := range pods {
		c, err := mc.limitPod(pod.UID, nil)
		capped[pod.UID] = c
		switch {
		case err == nil:
			if why := mc.uncappedBy(pod.UID, c); why != "" {
				mc.notCapped(ctx, e.Namespace, pod, errors.New(why))
			}
		case errors.Is(err, dmem.ErrNoCgroup):
			go mc.awaitPodCgroup(e.Namespace, pod)
		default:
			mc.notCapped(ctx, e.Namespace, pod, err)
		}
	}
	mc.settle(ctx, capped)
}

// uncappedBy says why a pod whose limits were written is still not capped on a GPU where it
// holds an MPS share, or "".
func (mc *memoryCaps) uncappedBy(uid string, capped map[string]bool) string {
	for _, e := range mc.l.cp.Claims {
		if !hasPod(e, uid) {
			continue
		}
		for _, p := range e.Devices {
			if mc.capped(p) && !capped[mc.regions[p.GPUUUID]] {
				return fmt.Sprintf("the pod also holds a share of GPU %s that is not an MPS share (time-sliced or the whole GPU), whose processes a cgroup limit would cap too", p.Device)
			}
		}
	}
	return ""
}

// settle makes every claim that says cgroup but has a pod, among those just limited, that
// is not capped on the claim's GPU say mps-per-process: in its checkpoint entry and, for a
// claim already prepared, in its CDI spec (for containers started from now on; a running
// container keeps the environment it started with) and its status.devices. A claim being
// prepared with no pod known, or none capped, says so too. The caller holds mc.mu.
func (mc *memoryCaps) settle(ctx context.Context, capped map[string]map[string]bool) {
	for uid, e := range mc.l.cp.Claims {
		uncapped := false
		for _, p := range e.Devices {
			if p.MemoryCap != MemoryCapCgroup {
				continue
			}
			if len(e.Pods) == 0 {
				uncapped = true
			}
			for _, pod := range e.Pods {
				if c, ok := capped[pod.UID]; ok && !c[mc.regions[p.GPUUUID]] {
					uncapped = true
				}
			}
		}
		if uncapped {
			mc.perProcess(ctx, uid, e)
		}
	}
}

// perProcess tells a claim with a pod that could not be limited that its processes are
// capped one by one only. An entry still being prepared is written by its caller; a prepared
// one gets its CDI spec rewritten and its status updated.
func (mc *memoryCaps) perProcess(ctx context.Context, uid string, e *checkpoint.ClaimEntry) {
	for i := range e.Devices {
		p := &e.Devices[i]
		if p.MemoryCap == MemoryCapCgroup {
			p.MemoryCap = MemoryCapMPSPerProcess
			p.MemoryEnforcement = perProcessWhy + strings.TrimPrefix(p.MemoryEnforcement, cgroupWhy)
		}
	}
	if e.State != checkpoint.PrepareCompleted {
		return
	}
	logger := klog.FromContext(ctx)
	logger.Info("A pod of a prepared claim is not capped through its cgroup: the claim's GPU memory is capped per MPS client process only", "claim", klog.KRef(e.Namespace, e.Name))
	if err := mc.l.save(); err != nil {
		// The entry says so in memory; the next save or a restart's recover writes it.
		logger.Error(err, "Recording a claim's fallback to per-process GPU memory caps", "claim", klog.KRef(e.Namespace, e.Name))
	}
	if _, err := mc.specs.write(uid, e); err != nil {
		logger.Error(err, "Rewriting a claim's CDI spec for its fallback to per-process GPU memory caps", "claim", klog.KRef(e.Namespace, e.Name))
	}
	if mc.capChanged != nil {
		go mc.capChanged(mc.background, e.Namespace, e.Name, uid)
	}
}

// awaitPodCgroup applies a pod's caps once its cgroup appears. Until then the pod's containers,
// if already running, are capped per MPS client process only; its claims say so (limitPods),
// also once the cap is there: their containers may have started without it.
func (mc *memoryCaps) awaitPodCgroup(ns string, pod checkpoint.PodRef) {
	ctx := mc.background
	deadline := time.Now().Add(cgroupWait)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cgroupPoll):
		}
		mc.mu.Lock()
		_, err := mc.limitPod(pod.UID, nil)
		mc.mu.Unlock()
		if err == nil {
			return
		}
		if !errors.Is(err, dmem.ErrNoCgroup) || time.Now().After(deadline) {
			mc.notCapped(ctx, ns, pod, err)
			return
		}
	}
}

// unlimitPods recomputes the caps of a removed claim's pods: what their other claims on the
// GPU still hold, or none. A pod already gone (its cgroup removed) needs nothing.
func (mc *memoryCaps) unlimitPods(ctx context.Context, e *checkpoint.ClaimEntry) {
	regions := map[string]bool{}
	for _, p := range e.Devices {
		if r := mc.regions[p.GPUUUID]; r != "" {
			regions[r] = true
		}
	}
	if len(regions) == 0 {
		return
	}
	for _, pod := range e.Pods {
		if _, err := mc.limitPod(pod.UID, regions); err != nil && !errors.Is(err, dmem.ErrNoCgroup) {
			klog.FromContext(ctx).Error(err, "Lifting a released claim's GPU memory cap from its pod's cgroup", "pod", klog.KRef(e.Namespace, pod.Name), "podUID", pod.UID)
		}
	}
}

func (mc *memoryCaps) notCapped(ctx context.Context, ns string, pod checkpoint.PodRef, err error) {
	msg := fmt.Sprintf("GPU memory of pod %s is not capped as a whole (cgroup dmem.max): %v; each of its MPS client processes stays capped at its claim's limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)", pod.Name, err)
	klog.FromContext(ctx).Error(err, "Cannot cap a pod's GPU memory through its cgroup", "pod", klog.KRef(ns, pod.Name), "podUID", pod.UID)
	if mc.podEvent != nil {
		mc.podEvent(ctx, ns, pod, ReasonCgroupMemoryNotCapped, msg)
	}
}
