package fake

import (
	"os"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestFaultsInjectedEachKindAndCleared(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creates device nodes: needs root")
	}
	dir := t.TempDir()
	b, err := New(Fleet{GPUs: []FleetGPU{{Model: "H100-80GB", Count: 2}}}, "n", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := b.Devices()
	if got, errs := b.Faults(); len(errs) != 0 || len(got) != 0 {
		t.Fatalf("a fresh fleet has faults %v (%v)", got, errs)
	}
	lines := []string{"xid 79", "ecc-dbe page 0x12", "lost", "row-remap-failure", "thermal", "power"}
	want := []gpu.Severity{gpu.SeverityFatal, gpu.SeverityFatal, gpu.SeverityFatal, gpu.SeverityDegraded, gpu.SeverityDegraded, gpu.SeverityDegraded}
	for _, l := range lines {
		if err := InjectFault(dir, 1, l); err != nil {
			t.Fatal(err)
		}
	}
	got, errs := b.Faults()
	if len(errs) != 0 {
		t.Fatal(errs)
	}
	if len(got[devs[0].UUID]) != 0 || len(got[devs[1].UUID]) != len(lines) {
		t.Fatalf("faults by GPU: %v", got)
	}
	for i, f := range got[devs[1].UUID] {
		if f.Severity() != want[i] || f.Since.IsZero() || f.Latched {
			t.Errorf("%q: got %+v severity %v, want %v", lines[i], f, f.Severity(), want[i])
		}
	}
	if f := got[devs[1].UUID][1]; f.Kind != gpu.FaultECC || f.Detail != "page 0x12" {
		t.Errorf("ecc fault %+v", f)
	}
	if err := RemoveFaults(dir, 1); err != nil {
		t.Fatal(err)
	}
	if got, errs := b.Faults(); len(errs) != 0 || len(got) != 0 {
		t.Fatalf("cleared faults still reported: %v (%v)", got, errs)
	}
}

func TestParseFaultRefusesWhatItDoesNotKnow(t *testing.T) {
	for _, l := range []string{"", "xid", "xid seventy", "meltdown", "mps-server"} {
		if _, err := ParseFault(l); err == nil {
			t.Errorf("%q accepted", l)
		}
	}
	if err := InjectFault(t.TempDir(), 0, "meltdown"); err == nil {
		t.Error("an unknown fault was injected")
	}
	for _, l := range []string{"xid 13 action=explode", "xid 13 action="} {
		if _, err := ParseFault(l); err == nil {
			t.Errorf("%q accepted", l)
		}
	}
	if f, err := ParseFault("xid 13 action=gpu-reset client A"); err != nil || f.Action != gpu.RecoveryGPUReset || f.Detail != "client A" || f.Severity() != gpu.SeverityFatal {
		t.Errorf("an XID with its driver's recovery action: %+v, %v", f, err)
	}
	f, err := ParseFault("xid 31")
	if err != nil || !gpu.ApplicationXID(f.XID) || f.Reason() != "xid-31" {
		t.Errorf("xid 31: %+v %v", f, err)
	}
}

// A line that is no fault makes its GPU unreadable as a whole (it keeps its last verdict
// in the plugin); the other GPUs are read as usual.
func TestUnparsableFaultFileMakesOnlyItsGPUUnreadable(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creates device nodes: needs root")
	}
	dir := t.TempDir()
	b, err := New(Fleet{GPUs: []FleetGPU{{Model: "H100-80GB", Count: 2}}}, "n", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := b.Devices()
	if err := InjectFault(dir, 0, "thermal"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(FaultFile(dir, 1), []byte("power\nthermall\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, errs := b.Faults()
	if len(errs) != 1 || errs[devs[1].UUID] == nil {
		t.Errorf("errors %v, want one for gpu-1 only", errs)
	}
	if len(got) != 1 || len(got[devs[0].UUID]) != 1 {
		t.Errorf("faults %v, want gpu-0's thermal only", got)
	}
}
