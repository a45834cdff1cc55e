package fake

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"syscall"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestUsageIsReportedPerLiveProcessAndCapped(t *testing.T) {
	dir := t.TempDir()
	b, err := New(Fleet{GPUs: []FleetGPU{{Model: "H100-80GB", Count: 2}}}, "n", dir, "x")
	if err != nil {
		t.Fatal(err)
	}
	uuid := b.devices[1].UUID
	self := os.Getpid()
	const dead = 1 << 22 // above the kernel's pid_max
	if err := ReportUsage(dir, 1, self, 3<<30, 40, 4<<30); err != nil {
		t.Fatal(err)
	}
	if err := ReportUsage(dir, 1, dead, 1<<30, 10, 0); err != nil {
		t.Fatal(err)
	}
	got, err := b.ProcessUsage(uuid)
	if want := []gpu.ProcessUsage{{PID: self, MemoryBytes: 3 << 30, SMPercent: 40}}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("ProcessUsage = %+v, %v; want %+v (the dead process left out)", got, err, want)
	}
	if pids, err := b.ComputeProcesses(uuid); err != nil || !reflect.DeepEqual(pids, []int{self}) {
		t.Fatalf("ComputeProcesses = %v, %v; want [%d]: a process using the GPU is a compute process, a dead one is not", pids, err, self)
	}
	// Past the cap the allocation fails and what the process held stays.
	if err := ReportUsage(dir, 1, self, 5<<30, 90, 4<<30); !errors.Is(err, ErrOutOfMemory) {
		t.Fatalf("5Gi under a 4Gi cap: %v; want ErrOutOfMemory", err)
	}
	if got, _ := b.ProcessUsage(uuid); len(got) != 1 || got[0].MemoryBytes != 3<<30 {
		t.Fatalf("after the failed allocation: %+v; want 3Gi still held", got)
	}
	// Nothing held and no sample: the process is off the GPU.
	if err := ReportUsage(dir, 1, self, 0, -1, 0); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.ProcessUsage(uuid); len(got) != 0 {
		t.Fatalf("after release: %+v; want none", got)
	}
	if got, _ := b.ProcessUsage(b.devices[0].UUID); len(got) != 0 {
		t.Fatalf("the other GPU: %+v; want none", got)
	}
	if err := os.WriteFile(UsageFile(dir, 0), []byte("12 lots 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := b.ProcessUsage(b.devices[0].UUID); err == nil {
		t.Fatal("a malformed usage file gave no error")
	}
	if err := ReportUsage(dir, 1, self, 1, 101, 0); err == nil {
		t.Fatal("SM 101% accepted")
	}
}

// What a fake GPU's processes use sizes claims: only root writes it, whatever the umask.
func TestUsageFilesAreWritableOnlyByRoot(t *testing.T) {
	dir := t.TempDir()
	defer syscall.Umask(syscall.Umask(0))
	if err := ReportUsage(dir, 0, os.Getpid(), 1<<30, 10, 0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{UsageFile(dir, 0), UsageFile(dir, 0) + ".lock"} {
		fi, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm&0o022 != 0 {
			t.Errorf("%s has mode %v; want it writable only by its owner", filepath.Base(f), perm)
		}
	}
}
