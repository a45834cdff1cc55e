package controller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/fgpu-dev/fgpu/pkg/controller/loadgen"
)

// TestBurstNeverOvercommits runs the allocator with parallel workers over a fake API server
// and checks the invariant after a burst.
func TestBurstNeverOvercommits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := loadgen.Defaults()
	o.Nodes, o.Claims, o.Timeout = 20, 200, time.Minute
	client := fake.NewSimpleClientset(MakeClass(shareClass))
	if err := loadgen.Setup(ctx, client, o); err != nil {
		t.Fatal(err)
	}
	c := New(DefaultConfig(), client, nil, nil)
	go func() { _ = c.Run(ctx) }()
	for !c.Synced() {
		time.Sleep(10 * time.Millisecond)
	}
	rep, err := loadgen.Burst(ctx, client, o)
	if err != nil {
		t.Fatal(err)
	}
	if rep.InvariantErr != nil {
		c.mu.Lock()
		for k, g := range c.st.gpus {
			if len(g.tenants) > 8 {
				t.Logf("state %s: used %s of %s, %d tenants known=%v", k, fmtBytes(g.usedMem), fmtBytes(g.memCap), len(g.tenants), g.known)
			}
		}
		for _, n := range []string{"bench-claim-00000", "bench-claim-00001"} {
			cl, _ := client.ResourceV1().ResourceClaims(o.Namespace).Get(ctx, n, metav1.GetOptions{})
			r := cl.Status.Allocation.Devices.Results[0]
			t.Logf("API %s: %s/%s %v sid %s", n, r.Pool, r.Device, r.ConsumedCapacity, *r.ShareID)
			if rec := c.st.claims[claimKey(cl)]; rec != nil {
				t.Logf("state %s: %s sid %s", n, rec.shares[0].gpu.key, rec.shares[0].t.shareID)
			} else {
				t.Logf("state %s: none (uid %q)", n, cl.UID)
			}
		}
		c.mu.Unlock()
		t.Fatal(rep.InvariantErr.Error()[:300])
	}
	if rep.Allocated != o.Claims {
		t.Fatalf("allocated %d of %d", rep.Allocated, o.Claims)
	}
	t.Log(rep)
}
