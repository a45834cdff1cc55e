package plugin

import (
	"context"
	"slices"
	"testing"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// crashAt is a fault injector that records what the node holds at the hook and then
// "kills" the plugin there by panicking out of Prepare.
type crashAt struct {
	s     *State
	uid   string
	state checkpoint.ClaimState
	spec  bool
}

type crashed struct{}

func (c *crashAt) PrepareApplied(context.Context) {
	c.state = c.s.cp.Claims[c.uid].State
	uids, _ := c.s.cdi.ClaimUIDs()
	c.spec = slices.Contains(uids, c.uid)
	panic(crashed{})
}

// The seam the e2e crash test stops at: after the side effects, before Completed. A plugin
// killed there restarts clean, and the kubelet's retry prepares the claim.
func TestFaultInjectorStopsPrepareBeforeCompleted(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns", "victim").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	hook := &crashAt{s: s, uid: string(claim.UID)}
	prev := faults
	faults = hook
	t.Cleanup(func() { faults = prev })
	func() {
		defer func() {
			if _, ok := recover().(crashed); !ok {
				t.Fatal("the fault injector was not called")
			}
		}()
		_, _ = s.Prepare(ctx, claim)
	}()
	faults = prev
	if hook.state != checkpoint.PrepareStarted || !hook.spec {
		t.Fatalf("at the hook the claim should be PrepareStarted with its spec written: state %q, spec %v", hook.state, hook.spec)
	}

	restarted := e.state()
	if claims := restarted.PreparedClaims(); len(claims) != 0 {
		t.Fatalf("the restart kept a half-prepared claim: %+v", claims)
	}
	if keys, _ := restarted.daemons.mps.Keys(context.Background()); len(keys) != 0 || e.specCount() != 0 {
		t.Fatalf("the restart left daemons %v and %d specs", keys, e.specCount())
	}
	if _, err := restarted.Prepare(ctx, claim); err != nil {
		t.Fatalf("kubelet's retry must succeed: %v", err)
	}
	if e := restarted.PreparedClaims()[string(claim.UID)]; e.State != checkpoint.PrepareCompleted {
		t.Fatalf("after the retry: %+v", e)
	}
}
