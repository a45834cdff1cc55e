package plugin

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// A GPU's health taints are its health series: healthy 0 and the condition 1 while the taint
// holds, and back when it clears.
func TestHealthMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	devs := []gpu.Device{{Index: 0, UUID: "GPU-a"}, {Index: 1, UUID: "GPU-b"}}
	taints := map[string][]resourceapi.DeviceTaint{"GPU-b": {{Key: configapi.FaultTaintKey, Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute}}}
	m.observeHealth(devs, func(uuid string) []resourceapi.DeviceTaint { return taints[uuid] })
	want := `
# HELP fgpu_gpu_healthy 1 while the GPU has no health taint (fault, degraded, flapping), else 0.
# TYPE fgpu_gpu_healthy gauge
fgpu_gpu_healthy{gpu="gpu-0",uuid="GPU-a"} 1
fgpu_gpu_healthy{gpu="gpu-1",uuid="GPU-b"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fgpu_gpu_healthy"); err != nil {
		t.Error(err)
	}
	if v := testutil.ToFloat64(m.condition.WithLabelValues("gpu-1", "GPU-b", "fault")); v != 1 {
		t.Errorf("fault condition of gpu-1 = %v, want 1", v)
	}
	if n := testutil.CollectAndCount(m.condition); n != 6 {
		t.Errorf("%d condition series, want 3 per GPU", n)
	}
	delete(taints, "GPU-b")
	m.observeHealth(devs, func(uuid string) []resourceapi.DeviceTaint { return taints[uuid] })
	if v := testutil.ToFloat64(m.healthy.WithLabelValues("gpu-1", "GPU-b")); v != 1 {
		t.Errorf("gpu-1 healthy = %v after its fault cleared, want 1", v)
	}
}

// A prepared claim's caps are served per claim: its memory limit and its thread percentage,
// and the memory guaranteed to it, below the cap for a burst share.
func TestClaimCapMetrics(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	c := builders.MakeClaim("ns", "a").Memory("10Gi").Compute("30").AllocatedOn(node, "gpu-0").Obj()
	burst := builders.MakeClaim("ns", "burst").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", nil)).Obj()
	for _, claim := range []*resourceapi.ResourceClaim{c, burst} {
		if _, err := s.PrepareFor(context.Background(), claim, nil); err != nil {
			t.Fatal(err)
		}
	}
	m := NewMetrics(prometheus.NewRegistry())
	m.observeState(s)
	if v := testutil.ToFloat64(m.claimCompute.WithLabelValues("ns", "a", "gpu-0")); v != 30 {
		t.Errorf("fgpu_claim_compute_limit_percent = %v, want 30", v)
	}
	for name, want := range map[string][2]float64{"a": {10 << 30, 10 << 30}, "burst": {30 << 30, 10 << 30}} {
		if v := testutil.ToFloat64(m.claimMemory.WithLabelValues("ns", name, "gpu-0")); v != want[0] {
			t.Errorf("%s: fgpu_claim_memory_limit_bytes = %v, want %v", name, v, want[0])
		}
		if v := testutil.ToFloat64(m.claimGuarantee.WithLabelValues("ns", name, "gpu-0")); v != want[1] {
			t.Errorf("%s: fgpu_claim_memory_guaranteed_bytes = %v, want %v", name, v, want[1])
		}
	}
}

// Past maxClaimSeries claims on a node, the per-claim series stop there (the first by
// namespace and name) and the rest are counted, so a runaway cannot swamp Prometheus.
func TestClaimSeriesAreCapped(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	claims := map[string]checkpoint.ClaimEntry{}
	latest := map[shareKey]sizing.Sample{}
	for i := range maxClaimSeries + 3 {
		uid := fmt.Sprintf("uid-%d", i)
		claims[uid] = checkpoint.ClaimEntry{Namespace: "ns", Name: fmt.Sprintf("c%04d", i)}
		latest[shareKey{uid, "gpu", "gpu-0"}] = sizing.Sample{MemoryBytes: 1, SMPercent: 1}
	}
	m.observeUsage(claims, latest)
	if n := testutil.CollectAndCount(m.claimUsed); n != maxClaimSeries {
		t.Errorf("%d claim series, want %d", n, maxClaimSeries)
	}
	if v := testutil.ToFloat64(m.omitted); v != 3 {
		t.Errorf("fgpu_claim_series_omitted = %v, want 3", v)
	}
	if v := testutil.ToFloat64(m.claimUsed.WithLabelValues("ns", "c0000", "gpu-0")); v != 1 {
		t.Errorf("the first claim by name is left out")
	}
}
