//go:build cgo

package nvml

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// healthEvents are the NVML events that latch a fault: critical XIDs and uncorrectable
// ECC errors. They say something happened, not that it still holds, so the fault stands
// until an admin clears it (ClearFaults, after a GPU reset). An XID latches only where the
// GPU needs a recovery action: the driver's, read when it comes, else the XID catalog's.
const healthEvents = gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError

var _ gpu.HealthMonitor = (*Backend)(nil)

// eventWait bounds one wait for an event, and so how long Close may wait for the watch.
const eventWait = 1000 // ms

// Faults implements gpu.HealthMonitor. The conditions a GPU can be asked for are asked now:
// a GPU that does not answer (ERROR_GPU_IS_LOST) is lost; a hardware thermal or power
// brake slowdown (clock event reasons) and a failed row remapping degrade it. The latched
// events of the watch that the first call starts are added to them. A GPU whose state NVML
// does not give is in errs; events that are not watched are errs[""].
func (b *Backend) Faults() (map[string][]gpu.Fault, map[string]error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	errs := map[string]error{}
	if b.closed {
		b.fmu.Lock()
		defer b.fmu.Unlock()
		for _, uuid := range b.uuids {
			errs[uuid] = errClosed
		}
		return nil, errs
	}
	if err := b.startWatch(); err != nil {
		errs[""] = err
	}
	now := time.Now()
	out := map[string][]gpu.Fault{}
	b.fmu.Lock()
	for uuid, fs := range b.latched {
		out[uuid] = slices.Clone(fs)
	}
	uuids := slices.Clone(b.uuids)
	b.fmu.Unlock()
	for _, uuid := range uuids {
		fs, err := b.conditions(uuid, now)
		if err != nil {
			errs[uuid] = err
		}
		out[uuid] = append(out[uuid], fs...)
		if len(out[uuid]) == 0 {
			delete(out, uuid)
		}
	}
	return out, errs
}

// conditions asks NVML for the GPU's present state. Caller holds b.mu for reading.
func (b *Backend) conditions(uuid string, now time.Time) ([]gpu.Fault, error) {
	lost := func(call string, ret gonvml.Return) []gpu.Fault {
		return []gpu.Fault{{Kind: gpu.FaultLost, Detail: fmt.Sprintf("nvml %s: %v", call, ret), Since: now}}
	}
	h, ret := b.lib.DeviceGetHandleByUUID(uuid)
	switch ret {
	case gonvml.SUCCESS:
	case gonvml.ERROR_GPU_IS_LOST:
		return lost("DeviceGetHandleByUUID", ret), nil
	default:
		return nil, fmt.Errorf("nvml DeviceGetHandleByUUID for GPU %s: %w", uuid, ret)
	}
	var out []gpu.Fault
	reasons, ret := h.GetCurrentClocksEventReasons()
	switch ret {
	case gonvml.SUCCESS:
		if reasons&gonvml.ClocksThrottleReasonHwThermalSlowdown != 0 {
			out = append(out, gpu.Fault{Kind: gpu.FaultThermal, Detail: "hardware thermal slowdown", Since: now})
		}
		if reasons&gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown != 0 {
			out = append(out, gpu.Fault{Kind: gpu.FaultPower, Detail: "hardware power brake slowdown", Since: now})
		}
	case gonvml.ERROR_GPU_IS_LOST:
		return lost("GetCurrentClocksEventReasons", ret), nil
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
	default:
		return nil, fmt.Errorf("nvml GetCurrentClocksEventReasons on GPU %s: %w", uuid, ret)
	}
	_, _, pending, failed, ret := h.GetRemappedRows()
	switch ret {
	case gonvml.SUCCESS:
		if failed {
			out = append(out, gpu.Fault{Kind: gpu.FaultRowRemap, Detail: fmt.Sprintf("row remapping failed (reset pending: %t)", pending), Since: now})
		}
	case gonvml.ERROR_GPU_IS_LOST:
		return lost("GetRemappedRows", ret), nil
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_FUNCTION_NOT_FOUND:
	default:
		return nil, fmt.Errorf("nvml GetRemappedRows on GPU %s: %w", uuid, ret)
	}
	return out, nil
}

// startWatch registers every GPU for the health events it supports, once, and waits for
// them in the background until Close. Caller holds b.mu for reading.
func (b *Backend) startWatch() error {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	if b.watching {
		return nil
	}
	set, ret := b.lib.EventSetCreate()
	if ret != gonvml.SUCCESS {
		// Retried at the next call; the polled conditions still work.
		return fmt.Errorf("nvml EventSetCreate: %w; XID and ECC events are not watched", ret)
	}
	var errs []error
	for _, uuid := range b.uuids {
		h, ret := b.lib.DeviceGetHandleByUUID(uuid)
		if ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("nvml DeviceGetHandleByUUID for GPU %s: %w", uuid, ret))
			continue
		}
		supported, ret := h.GetSupportedEventTypes()
		if ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("nvml GetSupportedEventTypes on GPU %s: %w; its XID and ECC events are not watched", uuid, ret))
			continue
		}
		if ret := h.RegisterEvents(supported&healthEvents, set); ret != gonvml.SUCCESS {
			errs = append(errs, fmt.Errorf("nvml RegisterEvents on GPU %s: %w; its XID and ECC events are not watched", uuid, ret))
		}
	}
	b.watching = true
	go b.watch(set)
	return errors.Join(errs...)
}

// watch latches each health event until the backend closes.
func (b *Backend) watch(set gonvml.EventSet) {
	for {
		b.mu.RLock()
		if b.closed {
			b.mu.RUnlock()
			return
		}
		data, ret := set.Wait(eventWait)
		if ret == gonvml.SUCCESS {
			b.latch(data)
		}
		b.mu.RUnlock()
		if ret != gonvml.SUCCESS && ret != gonvml.ERROR_TIMEOUT {
			// Not a busy loop on a broken set.
			time.Sleep(time.Second)
		}
	}
}

// latch records one event as a fault of its GPU. Caller holds b.mu for reading.
func (b *Backend) latch(data gonvml.EventData) {
	if data.Device == nil {
		return
	}
	uuid, ret := data.Device.GetUUID()
	if ret != gonvml.SUCCESS {
		return
	}
	f := gpu.Fault{Since: time.Now(), Latched: true}
	switch {
	case data.EventType&gonvml.EventTypeXidCriticalError != 0:
		f.Kind, f.XID = gpu.FaultXID, data.EventData
		f.Action, f.Detail = recoveryAction(data.Device)
		if f.Severity() == gpu.SeverityNone {
			return // one context's fault, not the GPU's
		}
	case data.EventType&gonvml.EventTypeDoubleBitEccError != 0:
		f.Kind, f.Detail = gpu.FaultECC, "double-bit ECC error"
	default:
		return
	}
	b.fmu.Lock()
	defer b.fmu.Unlock()
	if !slices.ContainsFunc(b.latched[uuid], func(o gpu.Fault) bool { return o.Reason() == f.Reason() }) {
		b.latched[uuid] = append(b.latched[uuid], f)
	}
}

// recoveryAction is what the driver says the GPU needs now, after an XID; empty where the
// driver does not say (before the field existed), and the XID catalog decides. An action
// this version does not know is taken for a reset, and named in detail.
func recoveryAction(dev gonvml.Device) (action gpu.RecoveryAction, detail string) {
	values := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := dev.GetFieldValues(values); ret != gonvml.SUCCESS || gonvml.Return(values[0].NvmlReturn) != gonvml.SUCCESS {
		return "", ""
	}
	var v uint64
	switch gonvml.ValueType(values[0].ValueType) {
	case gonvml.VALUE_TYPE_UNSIGNED_INT:
		v = uint64(binary.NativeEndian.Uint32(values[0].Value[:4]))
	case gonvml.VALUE_TYPE_UNSIGNED_LONG, gonvml.VALUE_TYPE_UNSIGNED_LONG_LONG:
		v = binary.NativeEndian.Uint64(values[0].Value[:])
	default:
		return "", ""
	}
	switch gonvml.DeviceGpuRecoveryAction(v) {
	case gonvml.GPU_RECOVERY_ACTION_NONE, gonvml.GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN:
		// IMEX is the multi-node NVLink fabric: the GPU's own work goes on.
		return gpu.RecoveryNone, ""
	case gonvml.GPU_RECOVERY_ACTION_GPU_RESET, gonvml.GPU_RECOVERY_ACTION_BUS_RESET:
		return gpu.RecoveryGPUReset, ""
	case gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT, gonvml.GPU_RECOVERY_ACTION_SYSTEM_REBOOT:
		return gpu.RecoveryNodeReboot, ""
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return gpu.RecoveryDrainP2P, ""
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return gpu.RecoveryDrainAndReset, ""
	}
	return gpu.RecoveryGPUReset, fmt.Sprintf("unknown NVML recovery action %d", v)
}

// ClearFaults implements gpu.HealthMonitor.
func (b *Backend) ClearFaults(uuid string) error {
	b.fmu.Lock()
	defer b.fmu.Unlock()
	delete(b.latched, uuid)
	return nil
}
