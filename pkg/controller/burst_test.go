package controller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"

	fgpufake "github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// TestBurstNeverOvercommits runs the allocator with parallel workers over a fake API server
// and checks the invariant after a burst.
func TestBurstNeverOvercommits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := loadgen.Defaults()
	o.Nodes, o.Claims, o.Timeout = 20, 200, time.Minute
	// NewSimpleClientset, not NewClientset: the field-managed tracker rebuilds a REST mapper
	// on every write, which turns the burst of 200 claims into a trickle of seconds.
	client := fake.NewSimpleClientset(builders.MakeClass(api.DeviceClassShared))
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
		c.model.mu.Lock()
		for k, g := range c.model.gpus {
			if len(g.tenants) > 8 {
				t.Logf("state %s: used %s of %s, %d tenants known=%v", k, fmtBytes(g.usedMem), fmtBytes(g.memCap), len(g.tenants), g.known)
			}
		}
		for _, n := range []string{"bench-claim-00000", "bench-claim-00001"} {
			cl, _ := client.ResourceV1().ResourceClaims(o.Namespace).Get(ctx, n, metav1.GetOptions{})
			r := cl.Status.Allocation.Devices.Results[0]
			t.Logf("API %s: %s/%s %v sid %s", n, r.Pool, r.Device, r.ConsumedCapacity, *r.ShareID)
			if rec := c.model.claims[claimKey(cl)]; rec != nil {
				t.Logf("state %s: %s sid %s", n, rec.shares[0].gpu.key, rec.shares[0].t.shareID)
			} else {
				t.Logf("state %s: none (uid %q)", n, cl.UID)
			}
		}
		c.model.mu.Unlock()
		t.Fatal(rep.InvariantErr.Error()[:300])
	}
	if rep.Allocated != o.Claims {
		t.Fatalf("allocated %d of %d", rep.Allocated, o.Claims)
	}
	t.Log(rep)
}

// With the controller's own loop (workers in parallel, no hand-driven syncs), a claim
// queued behind a quota-blocked one is placed as soon as the head of the queue is.
func TestQuotaQueueDrainsInRunLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(builders.MakeClass(api.DeviceClassShared), builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"))
	c := New(DefaultConfig(), client, fgpufake.NewSimpleClientset(builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("21Gi").Obj()), nil)
	go func() { _ = c.Run(ctx) }()
	create := func(name, mem string, sec int) {
		if _, err := client.ResourceV1().ResourceClaims("a").Create(ctx, builders.MakeClaim("a", name).Memory(mem).Created(sec).Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().Pods("a").Create(ctx, builders.MakePod("a", name).Claim(name).Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	allocated := func(name string) bool {
		cl, err := client.ResourceV1().ResourceClaims("a").Get(ctx, name, metav1.GetOptions{})
		return err == nil && cl.Status.Allocation != nil
	}
	waitUntil := func(what string, f func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if f() {
				return
			}
		}
		t.Fatal(what)
	}
	create("c1", "10Gi", 0)
	create("c2", "10Gi", 1)
	waitUntil("c1, c2 placed", func() bool { return allocated("c1") && allocated("c2") })
	create("c3", "10Gi", 2)
	create("small", "1Gi", 3)
	time.Sleep(500 * time.Millisecond)
	if allocated("c3") || allocated("small") {
		t.Fatal("over quota, or a later claim jumped the queue")
	}
	if err := client.ResourceV1().ResourceClaims("a").Delete(ctx, "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitUntil("c3 then small placed once c1 freed its quota", func() bool { return allocated("c3") && allocated("small") })
}
