package main

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

func TestParseSteps(t *testing.T) {
	got, err := parseSteps("0:2Gi:30, 600:6Gi:50")
	if err != nil || len(got) != 2 || got[1] != (step{At: 10 * time.Minute, Memory: 6 << 30, SM: 50}) {
		t.Fatalf("parseSteps = %+v, %v", got, err)
	}
	for _, bad := range []string{"0:2Gi", "10:1Gi:1,5:1Gi:1", "0:2Gi:101", "x:1Gi:1"} {
		if _, err := parseSteps(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestMPSCap(t *testing.T) {
	for env, want := range map[string]int64{"0=10240M": 10 << 30, "0=4G": 4 << 30, "": 0, "1=5M": 0} {
		if got := mpsCap(env); got != want {
			t.Errorf("mpsCap(%q) = %d, want %d", env, got, want)
		}
	}
}

// Growing past the MPS cap fails as a CUDA allocation would, and what the process held is
// taken off the GPU when it ends.
func TestReplayFailsPastTheCap(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=3072M")
	steps, _ := parseSteps("0:1Gi:10,1:2Gi:20,2:4Gi:30")
	err := replay(steps, dir, 0, 100, make(chan os.Signal))
	if !errors.Is(err, fake.ErrOutOfMemory) {
		t.Fatalf("replay = %v; want out of memory past 3Gi", err)
	}
	raw, _ := os.ReadFile(fake.UsageFile(dir, 0))
	if len(raw) != 0 {
		t.Fatalf("usage left behind: %q", raw)
	}
	if i, err := gpuIndex([]string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia3"}); err != nil || i != 3 {
		t.Fatalf("gpuIndex = %d, %v", i, err)
	}
}
