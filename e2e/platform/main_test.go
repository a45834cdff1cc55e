// Package platform is the e2e suite of fgpu in the monitoring stack platform teams run: a real
// Prometheus (built by e2e/cluster/build.sh) scrapes the allocator and the plugin, every query
// of every panel of the chart's Grafana dashboard must return data, and the KEDA example's
// query must follow the claims that wait.
package platform

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

var (
	cluster    *framework.Cluster
	fgpuClient versioned.Interface
)

func TestMain(m *testing.M) {
	c, err := framework.Setup(
		"allocationMode=allocator",
		"kubeletPlugin.gpus=fake:2xH100-80GB",
		"allocator.hostNetwork=true",
		// Claims' measured use within the test's time.
		"kubeletPlugin.usage.pollInterval=1s",
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	if c == nil {
		os.Exit(0)
	}
	cluster = c
	if fgpuClient, err = versioned.NewForConfig(c.Config); err == nil {
		err = cluster.WaitAllocatorReady(context.Background())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		_ = c.Uninstall(context.Background())
		os.Exit(1)
	}
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	err = c.Uninstall(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}
