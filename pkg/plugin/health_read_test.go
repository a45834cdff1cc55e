package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// partialMonitor answers for some GPUs and cannot read the others, as NVML does when one
// GPU's query fails.
type partialMonitor struct {
	gpu.Backend
	faults map[string][]gpu.Fault
	errs   map[string]error
}

func (m *partialMonitor) Faults() (map[string][]gpu.Fault, map[string]error) { return m.faults, m.errs }
func (m *partialMonitor) ClearFaults(string) error                           { return nil }

// A plugin restart while a fault holds is not a new onset: three restarts (a CrashLoop, a
// rolling upgrade) during one fault do not fence the GPU as flapping, nor tell of the
// fault again, nor move its taint's time.
func TestRestartIsNotAFaultOnset(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	uuid := s.Devices()[0].UUID
	e.inject(0, "thermal") // one fault, never cleared
	d := e.driver(s, e.backend())
	for range SlowdownPolls {
		d.health.refresh(ctx)
	}
	first := d.health.taints(uuid)
	if len(first) != 1 {
		t.Fatalf("taints %v", taintStrings(first))
	}
	for i := range 3 {
		d := e.driver(s, e.backend()) // a restart: fresh health from health.json
		if c := d.health.refresh(ctx); len(c) != 0 {
			t.Fatalf("restart %d: one uninterrupted fault reported again: %+v", i, c)
		}
		if got := d.health.taints(uuid); !slices.Equal(taintStrings(got), taintStrings(first)) || !got[0].TimeAdded.Equal(first[0].TimeAdded) {
			t.Errorf("restart %d: taints %v at %v, were %v at %v", i, taintStrings(got), got[0].TimeAdded, taintStrings(first), first[0].TimeAdded)
		}
	}
	// A condition that went while the plugin was down goes at its start.
	e.recoverGPU(0)
	d = e.driver(s, e.backend())
	if c := d.health.refresh(ctx); len(c) != 1 || c[0].Reason != ReasonGPURecovered {
		t.Errorf("changes %+v", c)
	}
	if got := d.health.taints(uuid); len(got) != 0 {
		t.Errorf("a condition that cleared while the plugin was down: %v", taintStrings(got))
	}
}

// One GPU whose faults cannot be read (an operator's typo in a fake fault file, an NVML
// query that keeps failing) does not keep another GPU's cleared condition standing.
func TestConditionClearsWhileAnotherGPUsFaultsCannotBeRead(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	d := e.driver(s, e.backend())
	e.inject(0, "row-remap-failure")
	if err := os.WriteFile(fake.FaultFile(e.cfg.DevRoot, 1), []byte("thermall\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d.health.refresh(ctx)
	if got := taintStrings(d.health.taints(s.Devices()[0].UUID)); !slices.Equal(got, []string{configapi.DegradedTaintKey + "=row-remap-failure:NoSchedule"}) {
		t.Fatalf("gpu-0 taints %v", got)
	}
	e.recoverGPU(0)
	d.health.refresh(ctx)
	if got := taintStrings(d.health.taints(s.Devices()[0].UUID)); len(got) != 0 {
		t.Errorf("gpu-0's condition cleared, but it stays tainted: %v", got)
	}
}

// docs/faults.md: a GPU whose faults cannot be read keeps its last verdict, also while
// another GPU has a fault.
func TestUnreadableGPUKeepsItsVerdict(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	devs := s.Devices()
	mon := &partialMonitor{Backend: e.backend(), faults: map[string][]gpu.Fault{
		devs[0].UUID: {{Kind: gpu.FaultRowRemap, Since: time.Now()}},
		devs[1].UUID: {{Kind: gpu.FaultRowRemap, Since: time.Now()}},
	}}
	d := e.driver(s, mon)
	d.health.refresh(ctx)
	mon.faults = map[string][]gpu.Fault{devs[0].UUID: {{Kind: gpu.FaultRowRemap, Since: time.Now()}}}
	mon.errs = map[string]error{devs[1].UUID: errors.New("nvml GetRemappedRows: Unknown Error")}
	for _, c := range d.health.refresh(ctx) {
		if c.UUID == devs[1].UUID {
			t.Errorf("gpu-1 could not be read, yet its health changed: %s: %s", c.Reason, c.Message)
		}
	}
	if got := taintStrings(d.health.taints(devs[1].UUID)); !slices.Equal(got, []string{configapi.DegradedTaintKey + "=row-remap-failure:NoSchedule"}) {
		t.Errorf("gpu-1 taints %v while its faults could not be read", got)
	}
	// Readable again, and healthy: the verdict goes.
	mon.faults, mon.errs = nil, nil
	d.health.refresh(ctx)
	if got := d.health.taints(devs[1].UUID); len(got) != 0 {
		t.Errorf("gpu-1 readable and healthy, taints %v", taintStrings(got))
	}
}

// An admin's clear holds while the GPU's faults cannot be read: the kept verdict is its
// conditions', and no latched fault is latched again from it.
func TestClearWorksWhileTheBackendErrs(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	devs := s.Devices()
	mon := &partialMonitor{Backend: e.backend(), faults: map[string][]gpu.Fault{
		devs[0].UUID: {{Kind: gpu.FaultXID, XID: 79, Latched: true, Since: time.Now()}},
	}}
	d := e.driver(s, mon)
	d.health.refresh(ctx)
	mon.faults, mon.errs = nil, map[string]error{devs[0].UUID: errors.New("nvml DeviceGetHandleByUUID: Unknown Error")}
	if err := os.MkdirAll(ClearFaultsDir(e.cfg.PluginDataDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ClearFaultsDir(e.cfg.PluginDataDir), "gpu-0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d.health.refresh(ctx)
	if got := taintStrings(d.health.taints(devs[0].UUID)); len(got) != 0 {
		t.Errorf("the admin cleared gpu-0, taints %v", got)
	}
	d2 := e.driver(s, &partialMonitor{Backend: e.backend()})
	d2.health.refresh(ctx)
	if got := taintStrings(d2.health.taints(devs[0].UUID)); len(got) != 0 {
		t.Errorf("the cleared fault was latched again and persisted: after a restart %v", got)
	}
}

// A thermal or power slowdown comes after SlowdownPolls polls in a row see it and goes
// after as many do not: a blip is no fault, no event and no flapping onset.
func TestSlowdownsAreDamped(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	uuid := s.Devices()[0].UUID
	d := e.driver(s, e.backend())
	for range 5 {
		e.inject(0, "power")
		if c := d.health.refresh(ctx); len(c) != 0 {
			t.Fatalf("a one-poll power brake changed the GPU's health: %+v", c)
		}
		e.recoverGPU(0)
		d.health.refresh(ctx)
	}
	e.inject(0, "thermal")
	for i := range SlowdownPolls {
		c := d.health.refresh(ctx)
		if (i == SlowdownPolls-1) != (len(c) == 1 && c[0].Reason == ReasonGPUFault) {
			t.Fatalf("poll %d: changes %+v", i+1, c)
		}
	}
	e.recoverGPU(0)
	for i := range SlowdownPolls {
		c := d.health.refresh(ctx)
		if got := d.health.taints(uuid); (i < SlowdownPolls-1) != (len(got) == 1) {
			t.Fatalf("poll %d after it cleared: taints %v, changes %+v", i+1, taintStrings(got), c)
		}
	}
	if rec := d.health.records[uuid]; rec == nil || len(rec.Onsets) != 1 {
		t.Errorf("record %+v, want one onset", rec)
	}
}
