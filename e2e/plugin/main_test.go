// Package plugin is the e2e suite of the kubelet plugin in scheduler mode: kube-scheduler
// allocates shares of one fake 80Gi GPU, the real kubelet calls the plugin, containerd
// applies its CDI specs, and fgpu-probe prints what each container received.
package plugin

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

var cluster *framework.Cluster

// suiteValues are the chart values the suite installs (and a test that changes them puts back).
var suiteValues = []string{"allocationMode=scheduler", "kubeletPlugin.gpus=fake:1xH100-80GB"}

func TestMain(m *testing.M) {
	c, err := framework.Setup(suiteValues...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	if c == nil {
		os.Exit(0)
	}
	cluster = c
	code := m.Run()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	err = c.Uninstall(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		code = 1
	}
	os.Exit(code)
}
