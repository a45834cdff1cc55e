// Package faults is the e2e suite of GPU faults in allocator mode: two fake GPUs, faults
// injected through their fault files, the plugin's taints, the eviction of pods on a GPU
// whose work cannot go on, and their replacements placed on the healthy GPU.
package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

var cluster *framework.Cluster

// fgpuBin is the fgpu CLI, built for the suite: an operator clears faults with it.
var fgpuBin string

// clearAll removes every injected fault and has the plugin clear every GPU's fault record.
func clearAll(ctx context.Context) error {
	for i := range 2 {
		if err := fake.RemoveFaults(devDir, i); err != nil {
			return err
		}
	}
	if out, err := framework.Run(ctx, fgpuBin, "faults", "clear", "all"); err != nil {
		return fmt.Errorf("fgpu faults clear all: %w: %s", err, out)
	}
	// The plugin reads the request at its next health poll.
	time.Sleep(5 * time.Second)
	return nil
}

// buildCLI builds the fgpu CLI into dir.
func buildCLI(dir string) (string, error) {
	bin := filepath.Join(dir, "fgpu")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/fgpu")
	cmd.Dir = framework.RepoRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the fgpu CLI: %w: %s", err, out)
	}
	return bin, nil
}

func TestMain(m *testing.M) {
	c, err := framework.Setup(
		"allocationMode=allocator",
		"kubeletPlugin.gpus=fake:2xH100-80GB",
		"allocator.hostNetwork=true",
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	if c == nil {
		os.Exit(0)
	}
	cluster = c
	dir, err := os.MkdirTemp("", "fgpu-e2e-faults-")
	if err == nil {
		fgpuBin, err = buildCLI(dir)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		_ = c.Uninstall(context.Background())
		os.Exit(1)
	}
	if err := cluster.WaitAllocatorReady(context.Background()); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		_ = c.Uninstall(context.Background())
		os.Exit(1)
	}
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	// A fault's fence outlives the plugin (its health record on the node), so that a restart
	// keeps it: the next suite must not inherit one a failed test left.
	if err := clearAll(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		code = 1
	}
	err = c.Uninstall(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		code = 1
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
