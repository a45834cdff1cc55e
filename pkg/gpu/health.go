package gpu

import (
	"fmt"
	"strings"
	"time"
)

// FaultKind is what went wrong with a GPU.
type FaultKind string

// The kinds of fault fgpu knows; docs/faults.md has the table of what each means.
const (
	// FaultXID is a critical XID error; its recovery action says whether it is the GPU's.
	FaultXID FaultKind = "xid"
	// FaultECC is an uncorrectable (double-bit) ECC error.
	FaultECC FaultKind = "ecc-dbe"
	// FaultLost is a GPU that stopped answering (fallen off the bus).
	FaultLost FaultKind = "lost"
	// FaultRowRemap is a failed row remapping: the GPU needs a reset.
	FaultRowRemap FaultKind = "row-remap-failure"
	// FaultThermal is a hardware thermal slowdown.
	FaultThermal FaultKind = "thermal"
	// FaultPower is a hardware power brake slowdown.
	FaultPower FaultKind = "power"
)

// FaultKinds are the kinds in the order of the documented table.
var FaultKinds = []FaultKind{FaultXID, FaultECC, FaultLost, FaultRowRemap, FaultThermal, FaultPower}

// Severity says what a fault means for the GPU's work.
type Severity int

const (
	// SeverityNone: the fault is not the GPU's (one context's error); it taints nothing.
	SeverityNone Severity = iota
	// SeverityDegraded: running work may continue, no new work should come.
	SeverityDegraded
	// SeverityFatal: the GPU's work cannot continue (the GPU is lost, or an
	// uncorrectable error broke it).
	SeverityFatal
)

func (s Severity) String() string {
	switch s {
	case SeverityFatal:
		return "fatal"
	case SeverityDegraded:
		return "degraded"
	}
	return "none"
}

// Fault is one condition of one GPU.
type Fault struct {
	Kind FaultKind `json:"kind"`
	// XID is the XID number of an FaultXID.
	XID uint64 `json:"xid,omitempty"`
	// Action is the recovery action the driver gave with an XID; empty where it gives none.
	Action RecoveryAction `json:"action,omitempty"`
	// Detail is for people (the ECC counter, the clock event reason, ...).
	Detail string `json:"detail,omitempty"`
	// Since is when the condition was first seen.
	Since time.Time `json:"since"`
	// Latched faults come from an event, not a state the GPU can be asked for again: they
	// stand until an admin clears them (docs/faults.md), also across plugin restarts.
	Latched bool `json:"latched,omitempty"`
}

// RecoveryAction is what the driver says a GPU needs after an XID: NVML's GPU recovery
// action (FI_DEV_GET_GPU_RECOVERY_ACTION, read when the XID comes), in NVIDIA's words.
type RecoveryAction string

const (
	// RecoveryNone: the fault was one context's (an application's illegal access, a killed
	// channel, a contained ECC error); the GPU serves new processes as it is.
	RecoveryNone RecoveryAction = "none"
	// RecoveryGPUReset: the GPU's work is lost until the GPU is reset.
	RecoveryGPUReset RecoveryAction = "gpu-reset"
	// RecoveryNodeReboot: the fault may have left the operating system inconsistent.
	RecoveryNodeReboot RecoveryAction = "node-reboot"
	// RecoveryDrainP2P: peer-to-peer traffic must be drained.
	RecoveryDrainP2P RecoveryAction = "drain-p2p"
	// RecoveryDrainAndReset: the GPU runs at reduced capacity; drain its work, then reset it.
	RecoveryDrainAndReset RecoveryAction = "drain-and-reset"
)

// RecoveryActions are the actions a fake GPU's fault may name.
var RecoveryActions = []RecoveryAction{RecoveryNone, RecoveryGPUReset, RecoveryNodeReboot, RecoveryDrainP2P, RecoveryDrainAndReset}

// Severity: a GPU that must be reset or its node rebooted runs no work until then; one to be
// drained keeps its work but takes no more; none is no fault of the GPU's.
func (a RecoveryAction) Severity() Severity {
	switch a {
	case RecoveryNone:
		return SeverityNone
	case RecoveryDrainP2P, RecoveryDrainAndReset:
		return SeverityDegraded
	}
	return SeverityFatal
}

// xidActions is what NVIDIA's XID catalog says each well-known XID needs, for drivers that
// do not give the recovery action. Those of one context (an application's bug, a channel
// the driver reset) need none: under MPS the server of the faulting client's isolation
// domain goes to FAULT, which the plugin's MPS check handles in that domain.
var xidActions = map[uint64]RecoveryAction{
	// GPU stopped processing (a channel's idle timeout), graphics engine exception, MMU
	// fault, reset channel, preemptive clean-up, video engine exception, graphics engine
	// class error, contained ECC error, context switch timeout.
	8: RecoveryNone, 13: RecoveryNone, 31: RecoveryNone, 43: RecoveryNone, 45: RecoveryNone,
	68: RecoveryNone, 69: RecoveryNone, 94: RecoveryNone, 109: RecoveryNone,
	// Double-bit ECC, micro-controller halt, page retirement failure, NVLink error,
	// uncontained ECC, GSP timeout and error, unrecovered ECC.
	48: RecoveryGPUReset, 62: RecoveryGPUReset, 64: RecoveryGPUReset, 74: RecoveryGPUReset,
	95: RecoveryGPUReset, 119: RecoveryGPUReset, 120: RecoveryGPUReset, 140: RecoveryGPUReset,
	// Fallen off the bus.
	79: RecoveryNodeReboot,
}

// XIDAction is what the XID catalog says an XID needs; known is false for an XID it does
// not list.
func XIDAction(xid uint64) (action RecoveryAction, known bool) {
	action, known = xidActions[xid]
	return action, known
}

// ApplicationXID reports XIDs that one context's fault causes: they say nothing about the
// GPU.
func ApplicationXID(xid uint64) bool {
	action, known := XIDAction(xid)
	return known && action == RecoveryNone
}

// Severity is the documented table (docs/faults.md) in code. An XID's is its recovery
// action's: the driver's, else the catalog's; an XID neither knows degrades the GPU.
func (f Fault) Severity() Severity {
	switch f.Kind {
	case FaultECC, FaultLost:
		return SeverityFatal
	case FaultXID:
		action, known := f.Action, f.Action != ""
		if !known {
			action, known = XIDAction(f.XID)
		}
		if known {
			return action.Severity()
		}
	}
	return SeverityDegraded
}

// Reason names the fault in a taint's value: a valid label value.
func (f Fault) Reason() string {
	if f.Kind == FaultXID {
		return fmt.Sprintf("xid-%d", f.XID)
	}
	return string(f.Kind)
}

// String is for logs and events.
func (f Fault) String() string {
	var notes []string
	if f.Action != "" {
		notes = append(notes, "recovery action "+string(f.Action))
	}
	if f.Detail != "" {
		notes = append(notes, f.Detail)
	}
	if len(notes) == 0 {
		return f.Reason()
	}
	return f.Reason() + " (" + strings.Join(notes, "; ") + ")"
}

// HealthMonitor is a backend that reports GPU faults. The plugin polls it; every backend
// fgpu ships implements it.
type HealthMonitor interface {
	// Faults returns each GPU's current faults by UUID: the conditions the GPU is in now
	// and the latched faults of events not cleared since. A GPU missing from the map is
	// healthy, unless errs names it: errs holds, by UUID, why a GPU's conditions could not
	// be read (the caller keeps that GPU's last verdict; its latched faults are still
	// listed), and under "" a problem that leaves every reading valid (e.g. events not
	// watched).
	Faults() (faults map[string][]Fault, errs map[string]error)
	// ClearFaults drops a GPU's latched faults (an admin's word that it recovered).
	ClearFaults(uuid string) error
}
