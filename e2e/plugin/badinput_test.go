package plugin

import (
	"context"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// A claim with an invalid opaque config fails with a clear message on the pod's events, and
// nothing is left behind once the pod is gone.
func TestInvalidConfigIsReportedOnThePod(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "bad")
	cases := []struct {
		name string
		cfg  map[string]any
		want string
	}{
		{"unknown-mode", map[string]any{"mode": "vgpu"}, `unknown sharing mode "vgpu"`},
		{"memory-above-gpu", map[string]any{"memoryLimit": "100Gi"}, "memoryLimit 100Gi is above the 10Gi allocated to the claim (GPU gpu-0 has 79Gi allocatable)"},
		{"negative-compute", map[string]any{"computePercent": -5}, "computePercent -5 must be between 1 and 100"},
	}
	for _, tc := range cases {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, tc.name).Memory("10Gi").Config(tc.cfg)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range cases {
		msg, err := cluster.WaitEvent(ctx, ns, tc.name, tc.want, 2*time.Minute)
		if err != nil {
			t.Error(err)
			continue
		}
		t.Logf("%s: %s", tc.name, msg)
	}
	st, _ := framework.ReadNodeState()
	if len(st.SpecClaims) != 0 || len(st.MPSDirs) != 0 || len(st.Daemons) != 0 || len(st.Checkpoint.Claims) != 0 {
		t.Fatalf("a refused claim left state behind: %+v", st)
	}
}
