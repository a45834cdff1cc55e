package plugin

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// ModeExclusive is recorded for a claim that holds a whole GPU: it needs no MPS server.
const ModeExclusive = "exclusive"

// planner turns allocations into the devices to prepare. It reads only the node's GPUs and
// configuration, so it holds no state and needs no lock.
type planner struct {
	cfg     Config
	devices map[string]gpu.Device // by device name
	// caps says which GPUs cap MPS shares through the pod cgroup (FGPU_MEMORY_CAP).
	caps interface{ partitions(uuid string) bool }
}

// plan turns a claim's allocation into the devices to prepare, or a clear error that names
// the claim, the GPU and the numbers. It has no side effects.
func (pr *planner) plan(claim *resourceapi.ResourceClaim) ([]checkpoint.PreparedDevice, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var planned []checkpoint.PreparedDevice
	for _, r := range alloc.Devices.Results {
		if r.Driver != pr.cfg.DriverName {
			continue
		}
		if r.Pool != pr.cfg.NodeName {
			return nil, fmt.Errorf("device %s/%s is allocated from pool %q, but this node's pool is %q", r.Pool, r.Device, r.Pool, pr.cfg.NodeName)
		}
		d, ok := pr.devices[r.Device]
		if !ok {
			return nil, refused(r.Device, shareOf(r), configapi.PrepareReasonDeviceGone, fmt.Errorf("allocated device %q does not exist on node %s", r.Device, pr.cfg.NodeName))
		}
		cfg, err := configapi.MergeConfigs(pr.cfg.DriverName, alloc.Devices.Config, r.Request)
		if err != nil {
			return nil, fmt.Errorf("request %q: %w", r.Request, err)
		}
		cfg.Normalize()
		p, err := pr.planDevice(claim.Namespace, d, r, cfg, tenantSetsCap(pr.cfg.DriverName, claim, r.Request))
		if err != nil {
			return nil, fmt.Errorf("request %q on %s: %w", r.Request, r.Device, err)
		}
		planned = append(planned, p)
	}
	if len(planned) == 0 {
		return nil, fmt.Errorf("claim %s/%s has no devices of driver %s", claim.Namespace, claim.Name, pr.cfg.DriverName)
	}
	mpsDevices := 0
	for _, p := range planned {
		if p.Mode == string(configapi.SharingModeMPS) {
			mpsDevices++
		}
	}
	if mpsDevices > 1 {
		return nil, fmt.Errorf("a claim can share at most one GPU through MPS (a container reaches one MPS server), got %d: request whole GPUs or use mode %q", mpsDevices, configapi.SharingModeTimeSlicing)
	}
	return planned, nil
}

// allocatedHere says whether a claim holds a device of this driver from this node's pool.
func (pr *planner) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == pr.cfg.DriverName && r.Pool == pr.cfg.NodeName {
			return true
		}
	}
	return false
}

// tenantSetsCap says whether the claim's own config, which its tenant writes, sets a burst
// cap (placement.memoryLimit) for request. The allocator refuses to place such a claim; an
// allocation that carries the tenant's cap anyway (written by something that did not put a
// placement of its own after it) must not raise the tenant's cap.
func tenantSetsCap(driver string, claim *resourceapi.ResourceClaim, request string) bool {
	for _, c := range claim.Spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver || !configapi.AppliesTo(c.Requests, request) {
			continue
		}
		if cfg, err := configapi.DecodeGpuConfig(c.Opaque.Parameters.Raw); err == nil && cfg.Placement != nil && cfg.Placement.MemoryLimit != nil {
			return true
		}
	}
	return false
}

// planDevice plans one device of a claim of namespace ns. The MPS daemon is the GPU's and
// the pair (ns, the config's sub-domain): the config, which tenants write in scheduler mode,
// can only subdivide the claim's own namespace, never name another's server. tenantCap says
// the claim's own config sets a burst cap (tenantSetsCap).
func (pr *planner) planDevice(ns string, d gpu.Device, r resourceapi.DeviceRequestAllocationResult, cfg *configapi.GpuConfig, tenantCap bool) (checkpoint.PreparedDevice, error) {
	allocatable := AllocatableMemory(d, pr.cfg.ReservedMemory)
	mem, compute := allocatable, int64(100)
	if r.ConsumedCapacity != nil {
		mem = quantity(r.ConsumedCapacity, configapi.CapacityMemory, allocatable)
		compute = quantity(r.ConsumedCapacity, configapi.CapacityCompute, 0)
	}
	if mem <= 0 || mem > allocatable {
		return checkpoint.PreparedDevice{}, fmt.Errorf("allocated memory %s is outside GPU %s's %s allocatable", bytesStr(mem), d.UUID, bytesStr(allocatable))
	}
	if compute < 0 || compute > 100 {
		return checkpoint.PreparedDevice{}, fmt.Errorf("allocated compute %d%% is outside 0-100%%", compute)
	}
	p := checkpoint.PreparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device, GPUUUID: d.UUID,
		MemoryBytes: mem, ComputePercent: compute,
		MemoryLimitBytes: mem, ThreadPercent: compute,
		Mode: string(cfg.Mode),
	}
	daemon := mps.Daemon{GPUUUID: d.UUID, Namespace: ns, Domain: cfg.IsolationDomain}
	p.IsolationDomain = daemon.Name()
	p.ShareID = shareOf(r)
	if cfg.MemoryLimit != nil {
		limit := cfg.MemoryLimit.Value()
		if limit > mem {
			return p, fmt.Errorf("memoryLimit %s is above the %s allocated to the claim (GPU %s has %s allocatable)", cfg.MemoryLimit, bytesStr(mem), d.Name(), bytesStr(allocatable))
		}
		p.MemoryLimitBytes = limit
	}
	if cfg.ComputePercent != nil {
		if compute > 0 && int64(*cfg.ComputePercent) > compute {
			return p, fmt.Errorf("computePercent %d is above the %d%% allocated to the claim", *cfg.ComputePercent, compute)
		}
		p.ThreadPercent = int64(*cfg.ComputePercent)
	}
	if mem == allocatable && p.Mode == string(configapi.SharingModeMPS) {
		// The claim holds the whole GPU: no co-tenant can exist, so no MPS server is needed.
		p.Mode = ModeExclusive
	}
	if p.Mode == string(configapi.SharingModeMPS) {
		p.MPSKey = daemon.Key()
	}
	if cfg.Placement != nil && cfg.Placement.MemoryLimit != nil {
		limit, err := pr.burstCap(p, d, cfg, tenantCap, allocatable)
		if err != nil {
			return p, err
		}
		p.MemoryLimitBytes = limit
	}
	p.MemoryCap = memoryCap(p.Mode, pr.caps.partitions(d.UUID))
	p.MemoryEnforced, p.MemoryEnforcement = pr.memoryEnforcement(p.Mode, p.MemoryCap, cfg.Placement)
	if p.MemoryLimitBytes > p.MemoryBytes {
		p.MemoryEnforcement += burstWhy
	}
	return p, nil
}

// burstWhy ends FGPU_MEMORY_ENFORCEMENT for a share whose cap is above its allocation.
const burstWhy = "; burst: the cap (FGPU_MEMORY_LIMIT) is above the guaranteed memory (FGPU_MEMORY_GUARANTEED), " +
	"and the guarantee holds only while the GPU's other tenants (all of this namespace and isolation domain) stay within theirs"

// burstCap returns the burst cap of the allocator's placement (placement.memoryLimit) for
// the planned share p, or an error naming the first rule it breaks. A cap above the
// allocation takes memory the GPU's other tenants were counted to have, so it is honoured
// only where nothing but the allocator can have written it (allocator mode, not the
// tenant's own config) and where only the same namespace's isolation domain can be hurt by
// it (no allowSharedGPU: checkIsolation keeps other domains off the GPU), for an MPS share,
// whose caps MPS enforces. A whole GPU has no use for one; time-slicing enforces no cap.
func (pr *planner) burstCap(p checkpoint.PreparedDevice, d gpu.Device, cfg *configapi.GpuConfig, tenantCap bool, allocatable int64) (int64, error) {
	limit := cfg.Placement.MemoryLimit.Value()
	var why string
	switch {
	case tenantCap:
		why = "the claim's own config sets it, and only the fgpu allocator may write placement"
	case !pr.cfg.Fenced:
		why = "the plugin runs in scheduler mode, where no allocator placed the claim"
	case cfg.Placement.AllowSharedGPU:
		why = "the placement lets other isolation domains use the GPU, and a burst must never take memory from another domain"
	case p.Mode == ModeExclusive:
		why = "the share holds the whole GPU, so there is nothing to burst into"
	case p.Mode != string(configapi.SharingModeMPS):
		why = fmt.Sprintf("the share is %s, which enforces no memory cap; a burst cap needs mode %s", p.Mode, configapi.SharingModeMPS)
	case cfg.MemoryLimit != nil:
		why = fmt.Sprintf("the claim's config also sets memoryLimit %s, and a share has one cap", cfg.MemoryLimit)
	case limit < p.MemoryBytes:
		why = fmt.Sprintf("it is below the %s allocated to the share", bytesStr(p.MemoryBytes))
	case limit > allocatable:
		why = fmt.Sprintf("it is above GPU %s's %s allocatable", d.Name(), bytesStr(allocatable))
	default:
		return limit, nil
	}
	return 0, fmt.Errorf("refusing the burst cap placement.memoryLimit %s: %s", cfg.Placement.MemoryLimit, why)
}

// What caps a share's GPU memory (checkpoint.PreparedDevice.MemoryCap, FGPU_MEMORY_CAP).
const (
	MemoryCapCgroup        = "cgroup"
	MemoryCapMPSPerProcess = "mps-per-process"
	MemoryCapNone          = "none"
	MemoryCapWholeGPU      = "whole-gpu"
)

// memoryCap: an MPS share on a GPU whose driver partitions memory through the dmem cgroup
// controller is capped per pod (and per process by MPS as before); other MPS shares per
// process only. Time-sliced claims get no cgroup limit: fgpu relies on dmem only for MPS
// clients, as NVIDIA documents it.
func memoryCap(mode string, cgroup bool) string {
	switch {
	case mode == ModeExclusive:
		return MemoryCapWholeGPU
	case mode != string(configapi.SharingModeMPS):
		return MemoryCapNone
	case cgroup:
		return MemoryCapCgroup
	}
	return MemoryCapMPSPerProcess
}

// The first words of FGPU_MEMORY_ENFORCEMENT for an MPS share.
const (
	perProcessWhy = "mps: caps each MPS client process, not the container as a whole; "
	cgroupWhy     = "cgroup: the pod's processes together are capped on this GPU (dmem.max of its cgroup), and MPS caps each client process too; "
)

// memoryEnforcement says whether nothing in the claim's containers can use more GPU memory
// than its limit, and why in one line. The cgroup limit is not counted on for processes that
// bypass MPS: NVIDIA documents it for MPS clients. MPS caps each client process, not a container, and
// binds MPS clients only: a process that bypasses the server (the device nodes are mounted)
// is stopped only by the GPU's EXCLUSIVE_PROCESS compute mode, which a GPU gets while one MPS
// server and nothing else uses it. That holds only where the allocator placed the claim on a
// GPU no other isolation domain may share (checkIsolation refuses to prepare one next to
// it): in scheduler mode kube-scheduler may put any namespace's claim, MPS or time-sliced,
// next to it.
func (pr *planner) memoryEnforcement(mode, memCap string, pl *configapi.Placement) (bool, string) {
	perProcess := perProcessWhy
	if memCap == MemoryCapCgroup {
		perProcess = cgroupWhy
	}
	switch {
	case mode == ModeExclusive:
		return true, "exclusive: the claim holds the whole GPU"
	case mode == string(configapi.SharingModeTimeSlicing):
		return false, "time-slicing: no memory cap"
	case !pr.cfg.Fenced:
		return false, perProcess + "in scheduler mode other namespaces' MPS servers or time-sliced claims may use this GPU, so a process that bypasses MPS is not capped"
	case pl == nil:
		return false, perProcess + "the allocation does not say the GPU is this isolation domain's alone, so a process that bypasses MPS is not capped"
	case pl.AllowSharedGPU:
		return false, perProcess + "the placement lets other isolation domains use this GPU, so a process that bypasses MPS is not capped"
	}
	return true, perProcess + "no other isolation domain can use this GPU, so none can bypass MPS here"
}

func quantity(m map[resourceapi.QualifiedName]resource.Quantity, name resourceapi.QualifiedName, def int64) int64 {
	q, ok := m[name]
	if !ok {
		return def
	}
	return q.Value()
}

func bytesStr(b int64) string {
	return resource.NewQuantity(b, resource.BinarySI).String()
}
