package gpu

import (
	"fmt"
	"time"
)

// FaultKind is what went wrong with a GPU.
type FaultKind string

// The kinds of fault fgpu knows; docs/faults.md has the table of what each means.
const (
	// FaultXID is a critical XID error that is the GPU's, not one application's.
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
	// SeverityDegraded: running work may continue, no new work should come.
	SeverityDegraded Severity = iota + 1
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
	// Detail is for people (the ECC counter, the clock event reason, ...).
	Detail string `json:"detail,omitempty"`
	// Since is when the condition was first seen.
	Since time.Time `json:"since"`
	// Latched faults come from an event, not a state the GPU can be asked for again: they
	// stand until an admin clears them (docs/faults.md), also across plugin restarts.
	Latched bool `json:"latched,omitempty"`
}

// fatalXIDs are the XIDs after which the GPU's work cannot go on: uncorrectable memory
// errors (48, 95), GPU fallen off the bus (79), GSP/firmware failures (119, 120), and
// an internal micro-controller halt (62). Every other critical XID that is not an
// application's own (ApplicationXID) degrades the GPU.
var fatalXIDs = map[uint64]bool{48: true, 62: true, 79: true, 95: true, 119: true, 120: true}

// ApplicationXID reports XIDs that an application's own bug causes (illegal memory access,
// a killed context, ...): they say nothing about the GPU. Under MPS such a fault still
// breaks every client of the server: the plugin's MPS check notices it on that server,
// which serves one isolation domain, not the GPU.
func ApplicationXID(xid uint64) bool {
	switch xid {
	case 13, 31, 43, 45, 68, 109:
		return true
	}
	return false
}

// Severity is the documented table (docs/faults.md) in code.
func (f Fault) Severity() Severity {
	switch f.Kind {
	case FaultECC, FaultLost:
		return SeverityFatal
	case FaultXID:
		if fatalXIDs[f.XID] {
			return SeverityFatal
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
	s := f.Reason()
	if f.Detail != "" {
		s += " (" + f.Detail + ")"
	}
	return s
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
