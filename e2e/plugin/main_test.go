// Package plugin is the e2e suite of the kubelet plugin in scheduler mode: kube-scheduler
// allocates shares of one fake 80Gi GPU, the real kubelet calls the plugin, containerd
// applies its CDI specs, and fgpu-probe prints what each container received.
package plugin

import (
	"context"
	"testing"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

var cluster *framework.Cluster

// suiteValues are the chart values the suite installs (and a test that changes them puts back).
var suiteValues = []string{"allocationMode=scheduler", "kubeletPlugin.gpus=fake:1xH100-80GB"}

func TestMain(m *testing.M) {
	framework.Main(m, framework.Suite{Values: suiteValues, Ready: func(_ context.Context, c *framework.Cluster) error {
		cluster = c
		return nil
	}})
}
