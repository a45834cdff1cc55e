package fake

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

func TestParseSpec(t *testing.T) {
	f, err := ParseSpec("2xH100-80GB,1xA100-40GB")
	if err != nil {
		t.Fatal(err)
	}
	if len(f.GPUs) != 2 || f.GPUs[0] != (FleetGPU{"H100-80GB", 2}) || f.GPUs[1] != (FleetGPU{"A100-40GB", 1}) {
		t.Fatalf("parsed %+v", f)
	}
	for _, bad := range []string{"", "H100", "x2H100", "2xH100 80GB"} {
		if _, err := ParseSpec(bad); err == nil {
			t.Errorf("ParseSpec(%q) accepted a malformed spec", bad)
		}
	}
}

func TestNewFleetIsDeterministicWithRealDeviceNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating device nodes needs root")
	}
	f, _ := ParseSpec("2xH100-80GB,1xA100-40GB")
	dir := t.TempDir()
	b, err := New(f, "node-a", dir, "fake-mps-control")
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := b.Devices()
	if len(devs) != 3 {
		t.Fatalf("got %d GPUs, want 3", len(devs))
	}
	if devs[0].Name() != "gpu-0" || devs[2].ProductName != "NVIDIA A100-SXM4-40GB" || devs[0].MemoryBytes != 80<<30 {
		t.Fatalf("unexpected devices %+v", devs)
	}
	for _, d := range devs {
		for _, p := range d.DeviceNodes {
			var st unix.Stat_t
			if err := unix.Stat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR {
				t.Fatalf("%s is not a character device: %v", p, err)
			}
		}
	}
	if devs[1].DeviceNodes[0] != filepath.Join(dir, "nvidia1") {
		t.Fatalf("gpu-1 node %s", devs[1].DeviceNodes[0])
	}

	again, err := New(f, "node-a", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	devs2, _ := again.Devices()
	other, _ := New(f, "node-b", t.TempDir(), "")
	devsB, _ := other.Devices()
	if devs2[0].UUID != devs[0].UUID || devsB[0].UUID == devs[0].UUID || devs[0].UUID == devs[1].UUID {
		t.Fatalf("UUIDs must be stable per node and distinct across GPUs and nodes: %s %s %s %s",
			devs[0].UUID, devs2[0].UUID, devsB[0].UUID, devs[1].UUID)
	}

	if err := b.SetComputeMode(devs[1].UUID, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	devs, _ = b.Devices()
	if devs[1].ComputeMode != gpu.ComputeModeExclusiveProcess || devs[0].ComputeMode != gpu.ComputeModeDefault {
		t.Fatalf("compute mode not recorded per GPU: %v %v", devs[0].ComputeMode, devs[1].ComputeMode)
	}
	if err := b.SetComputeMode("GPU-nope", gpu.ComputeModeDefault); err == nil {
		t.Fatal("unknown UUID accepted")
	}
}

func TestNewRefusesUnknownModel(t *testing.T) {
	_, err := New(Fleet{GPUs: []FleetGPU{{Model: "B200"}}}, "n", t.TempDir(), "")
	if err == nil || !strings.Contains(err.Error(), `unknown fake GPU model "B200"`) {
		t.Fatalf("got %v", err)
	}
}

func TestLoadFleetFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(p, []byte("gpus:\n- model: L4-24GB\n  count: 2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := LoadFleetFile(p)
	if err != nil || len(f.GPUs) != 1 || f.GPUs[0].Count != 2 {
		t.Fatalf("got %+v, %v", f, err)
	}
	if err := os.WriteFile(p, []byte("gpu:\n- model: L4-24GB\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadFleetFile(p); err == nil {
		t.Fatal("misspelled key accepted")
	}
}

// A fake GPU keeps its compute mode across backends, as a real one does across plugin
// restarts, and lists the processes a test wrote into its process file, as NVML would.
func TestComputeModeAndProcessesLiveBesideTheDeviceNodes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating device nodes needs root")
	}
	f, _ := ParseSpec("2xH100-80GB")
	dir := t.TempDir()
	b, err := New(f, "node-a", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	devs, _ := b.Devices()
	if err := b.SetComputeMode(devs[1].UUID, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatal(err)
	}
	again, err := New(f, "node-a", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	devs, _ = again.Devices()
	if devs[0].ComputeMode != gpu.ComputeModeDefault || devs[1].ComputeMode != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("compute modes after a new backend: %s, %s", devs[0].ComputeMode, devs[1].ComputeMode)
	}

	if pids, err := again.ComputeProcesses(devs[1].UUID); err != nil || len(pids) != 0 {
		t.Fatalf("processes on an idle GPU: %v, %v", pids, err)
	}
	if err := os.WriteFile(ProcessFile(dir, 1), []byte("4242\n77\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if pids, err := again.ComputeProcesses(devs[1].UUID); err != nil || len(pids) != 2 || pids[0] != 4242 || pids[1] != 77 {
		t.Fatalf("processes: %v, %v; want [4242 77]", pids, err)
	}
	if pids, _ := again.ComputeProcesses(devs[0].UUID); len(pids) != 0 {
		t.Fatalf("gpu-0 got gpu-1's processes: %v", pids)
	}
	if err := os.WriteFile(ProcessFile(dir, 1), []byte("nope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := again.ComputeProcesses(devs[1].UUID); err == nil {
		t.Fatal("a malformed process file gave no error")
	}
	if _, err := again.ComputeProcesses("GPU-unknown"); err == nil {
		t.Fatal("an unknown UUID gave no error")
	}
}

// A stand-in MPS server killed with its container cannot unlist itself; NVML lists live
// processes only, and so does the fake backend.
func TestDeadStandInServersAreNotListed(t *testing.T) {
	dir := t.TempDir()
	f, err := ParseSpec("1xH100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(f, "n1", dir, "")
	if err != nil {
		t.Fatal(err)
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	live := os.Getpid()
	content := fmt.Sprintf("%d\n%d\n", dead.Process.Pid, live)
	if err := os.WriteFile(ServerFile(dir, 0), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.ComputeProcesses(devs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{live}) {
		t.Fatalf("listed %v, want only the live server %d", got, live)
	}
}
