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
			return nil, refused(r.Device, configapi.PrepareReasonDeviceGone, fmt.Errorf("allocated device %q does not exist on node %s", r.Device, s.cfg.NodeName))
		}
		cfg, err := configapi.MergeConfigs(s.cfg.DriverName, alloc.Devices.Config, r.Request)
		if err != nil {
			return nil, fmt.Errorf("request %q: %w", r.Request, err)
		}
		cfg.Normalize()
		p, err := s.planDevice(d, r, cfg)
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

func (s *State) planDevice(d gpu.Device, r resourceapi.DeviceRequestAllocationResult, cfg *configapi.GpuConfig) (checkpoint.PreparedDevice, error) {
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
		Mode: string(cfg.Mode), IsolationDomain: cfg.IsolationDomain,
	}
	if r.ShareID != nil {
		p.ShareID = string(*r.ShareID)
	}
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
		p.MPSKey = mps.Daemon{GPUUUID: d.UUID, Domain: p.IsolationDomain}.Key()
	}
	return p, nil
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
