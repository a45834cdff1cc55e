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

// plan turns a claim's allocation into the devices to prepare, or a clear error that names
// the claim, the GPU and the numbers. It has no side effects.
func (s *State) plan(claim *resourceapi.ResourceClaim) ([]checkpoint.PreparedDevice, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	var planned []checkpoint.PreparedDevice
	for _, r := range alloc.Devices.Results {
		if r.Driver != s.cfg.DriverName {
			continue
		}
		if r.Pool != s.cfg.NodeName {
			return nil, fmt.Errorf("device %s/%s is allocated from pool %q, but this node's pool is %q", r.Pool, r.Device, r.Pool, s.cfg.NodeName)
		}
		d, ok := s.devices[r.Device]
		if !ok {
			return nil, refused(r.Device, shareOf(r), configapi.PrepareReasonDeviceGone, fmt.Errorf("allocated device %q does not exist on node %s", r.Device, s.cfg.NodeName))
		}
		cfg, err := configapi.MergeConfigs(s.cfg.DriverName, alloc.Devices.Config, r.Request)
		if err != nil {
			return nil, fmt.Errorf("request %q: %w", r.Request, err)
		}
		cfg.Normalize()
		p, err := s.planDevice(claim.Namespace, d, r, cfg)
		if err != nil {
			return nil, fmt.Errorf("request %q on %s: %w", r.Request, r.Device, err)
		}
		planned = append(planned, p)
	}
	if len(planned) == 0 {
		return nil, fmt.Errorf("claim %s/%s has no devices of driver %s", claim.Namespace, claim.Name, s.cfg.DriverName)
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

// planDevice plans one device of a claim of namespace ns. The MPS daemon is the GPU's and
// the pair (ns, the config's sub-domain): the config, which tenants write in scheduler mode,
// can only subdivide the claim's own namespace, never name another's server.
func (s *State) planDevice(ns string, d gpu.Device, r resourceapi.DeviceRequestAllocationResult, cfg *configapi.GpuConfig) (checkpoint.PreparedDevice, error) {
	allocatable := AllocatableMemory(d, s.cfg.ReservedMemory)
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
	p.MemoryCap = memoryCap(p.Mode, s.dmemRegions[d.UUID] != "")
	p.MemoryEnforced, p.MemoryEnforcement = s.memoryEnforcement(p.Mode, p.MemoryCap, cfg.Placement)
	return p, nil
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
func (s *State) memoryEnforcement(mode, memCap string, pl *configapi.Placement) (bool, string) {
	perProcess := perProcessWhy
	if memCap == MemoryCapCgroup {
		perProcess = cgroupWhy
	}
	switch {
	case mode == ModeExclusive:
		return true, "exclusive: the claim holds the whole GPU"
	case mode == string(configapi.SharingModeTimeSlicing):
		return false, "time-slicing: no memory cap"
	case !s.cfg.Fenced:
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
