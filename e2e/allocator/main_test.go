// Package allocator is the e2e suite of fgpu's allocator mode: the plugin fences two fake
// 80Gi GPUs, fgpu-allocator places every claim under SharingPolicies, kube-scheduler only
// honours its allocations, and the admission policy keeps users off the fence.
package allocator

import (
	"context"
	"testing"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

var (
	cluster    *framework.Cluster
	fgpuClient versioned.Interface
)

// suiteValues install the chart for the suite, and again after a test uninstalled it.
// allocationMode and sizing are the chart's defaults (allocator, Recommend):
// TestAllocatorPlacesShares and TestSizingRecommendChangesNothing show what a plain install
// gives.
var suiteValues = []string{
	"kubeletPlugin.gpus=fake:2xH100-80GB",
	"allocator.hostNetwork=true",
	"allocator.bindTimeout=" + bindTimeout,
	"allocator.orphanGrace=10s",
	"allocator.verbosity=4",
	// Sizing within a test's time: measure every second, report every 5 s, recommend
	// after 20 samples.
	"kubeletPlugin.usage.pollInterval=1s",
	"kubeletPlugin.usage.reportInterval=5s",
	// Steady use is reported only at the heartbeat: within the test, not after 30 minutes.
	"kubeletPlugin.usage.heartbeat=5s",
	"allocator.sizing.minSamples=20",
	// Burst admission compares the last 10 minutes of 5 s reports.
	"allocator.sizing.burstWindow=10m",
}

// bindTimeout is short so that the timeout-and-replace path runs within a test.
const bindTimeout = "20s"

func TestMain(m *testing.M) {
	framework.Main(m, framework.Suite{
		Values: suiteValues,
		Ready: func(ctx context.Context, c *framework.Cluster) (err error) {
			cluster = c
			if fgpuClient, err = versioned.NewForConfig(c.Config); err != nil {
				return err
			}
			return c.WaitAllocatorReady(ctx)
		},
		Teardown: func(ctx context.Context) error { deletePolicies(ctx); return nil },
	})
}
