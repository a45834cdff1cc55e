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
	var dir string
	framework.Main(m, framework.Suite{
		Values: []string{
			"allocationMode=allocator",
			"kubeletPlugin.gpus=fake:2xH100-80GB",
			"allocator.hostNetwork=true",
		},
		Ready: func(ctx context.Context, c *framework.Cluster) (err error) {
			cluster = c
			if dir, err = os.MkdirTemp("", "fgpu-e2e-faults-"); err != nil {
				return err
			}
			if fgpuBin, err = buildCLI(dir); err != nil {
				return err
			}
			return c.WaitAllocatorReady(ctx)
		},
		// A fault's fence outlives the plugin (its health record on the node), so that a
		// restart keeps it: the next suite must not inherit one a failed test left.
		Teardown: func(ctx context.Context) error {
			defer os.RemoveAll(dir)
			if fgpuBin == "" {
				return nil
			}
			return clearAll(ctx)
		},
	})
}
