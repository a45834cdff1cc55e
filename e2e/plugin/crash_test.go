package plugin

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// The plugin is SIGKILLed in the middle of a prepare (after the MPS daemon and the CDI spec,
// before the checkpoint says completed) and restarted by the kubelet: the pod still starts,
// and nothing is left over or duplicated.
func TestPluginKilledMidPrepare(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "crash")
	if err := os.WriteFile(framework.PauseTrigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(framework.PauseTrigger)
	pod, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "victim").Memory("10Gi"))
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(framework.PauseTrigger + ".paused")
		return err == nil, nil
	})
	if err != nil {
		t.Fatal("the plugin never reached the pause point (is its image built with FGPU_BUILD_TAGS=fgpu_e2e, as hack/e2e.sh does?)")
	}
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	uid := string(claim.UID)
	st, _ := framework.ReadNodeState()
	if e := st.Checkpoint.Claims[uid]; e == nil || e.State != checkpoint.PrepareStarted || !slices.Contains(st.SpecClaims, uid) {
		t.Fatalf("at the pause the claim should be PrepareStarted with its spec written: %+v", st)
	}
	before := framework.PluginPIDs()
	if n, err := framework.KillPlugin(); err != nil || n == 0 {
		t.Fatalf("killed %d plugin processes: %v", n, err)
	}
	os.Remove(framework.PauseTrigger)
	os.Remove(framework.PauseTrigger + ".paused")

	if _, err := cluster.WaitRunning(ctx, ns, "victim", 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	after := framework.PluginPIDs()
	if len(after) != 1 || slices.Contains(before, after[0]) {
		t.Fatalf("want one new plugin process, before %v after %v", before, after)
	}
	r, err := cluster.Probe(ctx, ns, "victim")
	if err != nil || r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=10240M" {
		t.Fatalf("container after restart got %v (%v)", r.Env, err)
	}
	st, err = framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Checkpoint.Claims) != 1 || st.Checkpoint.Claims[uid].State != checkpoint.PrepareCompleted {
		t.Errorf("checkpoint after restart: %+v", st.Checkpoint.Claims)
	}
	if !slices.Equal(st.SpecClaims, []string{uid}) || len(st.MPSDirs) != 1 || len(st.Daemons) != 1 {
		t.Errorf("after restart: specs %v, MPS dirs %v, daemons %v", st.SpecClaims, st.MPSDirs, st.Daemons)
	}
	for dir, pids := range st.Daemons {
		if len(pids) != 1 {
			t.Errorf("daemon for %s duplicated: %v", dir, pids)
		}
	}
	deletePod(t, ns, "victim")
	waitNodeState(t, func(s framework.NodeState) bool {
		return len(s.SpecClaims) == 0 && len(s.Daemons) == 0 && len(s.MPSDirs) == 0 && len(s.Checkpoint.Claims) == 0
	})
}
