// Package platform is the e2e suite of fgpu in the monitoring stack platform teams run: a real
// Prometheus (built by e2e/cluster/build.sh) scrapes the allocator and the plugin, every query
// of every panel of the chart's Grafana dashboard must return data, and the KEDA example's
// query must follow the claims that wait.
package platform

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

func TestMain(m *testing.M) {
	framework.Main(m, framework.Suite{
		Values: []string{
			"allocationMode=allocator",
			"kubeletPlugin.gpus=fake:2xH100-80GB",
			"allocator.hostNetwork=true",
			// Claims' measured use within the test's time: measure every second, report
			// every 5 s (steady use too), recommend after 20 samples, so that the
			// before-and-after panels (GPUs needed, use and size per namespace) have data.
			"kubeletPlugin.usage.pollInterval=1s",
			"kubeletPlugin.usage.reportInterval=5s",
			"kubeletPlugin.usage.heartbeat=5s",
			"allocator.sizing.minSamples=20",
		},
		Ready: func(ctx context.Context, c *framework.Cluster) (err error) {
			cluster = c
			if fgpuClient, err = versioned.NewForConfig(c.Config); err != nil {
				return err
			}
			return c.WaitAllocatorReady(ctx)
		},
	})
}
