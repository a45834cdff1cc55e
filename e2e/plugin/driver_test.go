package plugin

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// A claim's container sees the fake driver root's libraries, tools and sockets (laid out by the
// plugin under its state directory) at the paths a CUDA image expects.
func TestContainerSeesTheDriver(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "driver")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "cuda").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "cuda", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	r, err := cluster.Probe(ctx, ns, "cuda")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/usr/lib/x86_64-linux-gnu/libcuda.so",
		"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1",
		"/usr/local/nvidia/lib64/libnvidia-ml.so.1",
		"/usr/bin/nvidia-smi",
		"/run/nvidia-persistenced/socket",
	} {
		if !slices.Contains(r.DriverFiles, want) {
			t.Errorf("the container lacks %s; it has %v", want, r.DriverFiles)
		}
	}
}
