// Package tenancy is the e2e suite of issue #11: an ordinary tenant (a ServiceAccount with
// only `edit` in its namespace, framework.Tenant) attacks other namespaces' MPS servers and
// its own quota on the real local cluster, in allocator mode and in scheduler mode. The
// admin's client only sets up policies and checks results; after each test no GPU is over
// its memory or compute and no pod is stuck.
package tenancy

import (
	"context"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

var (
	cluster    *framework.Cluster
	fgpuClient versioned.Interface
	dynClient  dynamic.Interface
	// mode is the allocationMode the chart is installed with now.
	mode string
)

const (
	allocatorMode = "allocator"
	schedulerMode = "scheduler"
)

// Two fake 80Gi GPUs in both modes; tests of one mode sit together (allocator_test.go runs
// before scheduler_test.go), so the chart is reinstalled once.
var modeValues = map[string][]string{
	allocatorMode: {
		"allocationMode=allocator",
		"kubeletPlugin.gpus=fake:2xH100-80GB",
		"allocator.bindTimeout=20s",
		"allocator.orphanGrace=10s",
		"allocator.verbosity=4",
	},
	schedulerMode: {
		"allocationMode=scheduler",
		"kubeletPlugin.gpus=fake:2xH100-80GB",
	},
}

func TestMain(m *testing.M) {
	framework.Main(m, framework.Suite{
		Values: modeValues[allocatorMode],
		Ready: func(ctx context.Context, c *framework.Cluster) (err error) {
			cluster, mode = c, allocatorMode
			if fgpuClient, err = versioned.NewForConfig(c.Config); err != nil {
				return err
			}
			if dynClient, err = dynamic.NewForConfig(c.Config); err != nil {
				return err
			}
			return c.WaitAllocatorReady(ctx)
		},
		Teardown: func(ctx context.Context) error { deletePolicies(ctx); return nil },
	})
}

// useMode reinstalls the chart in the given allocation mode unless it runs in it already.
func useMode(t *testing.T, m string) {
	t.Helper()
	if mode == m {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := cluster.Install(ctx, modeValues[m]...); err != nil {
		t.Fatalf("install in %s mode: %v", m, err)
	}
	mode = m
	if m == allocatorMode {
		if err := cluster.WaitAllocatorReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
