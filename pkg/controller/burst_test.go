package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"

	fgpufake "github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
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
		c.model.EachGPU(func(g *model.GPU) {
			if g.NumTenants() > 8 {
				t.Logf("state %s: used %s of %s, %d tenants", g.Key(), fmtBytes(g.UsedMem()), fmtBytes(g.MemCap()), g.NumTenants())
			}
		})
		for _, n := range []string{"bench-claim-00000", "bench-claim-00001"} {
			cl, _ := client.ResourceV1().ResourceClaims(o.Namespace).Get(ctx, n, metav1.GetOptions{})
			r := cl.Status.Allocation.Devices.Results[0]
			t.Logf("API %s: %s/%s %v sid %s", n, r.Pool, r.Device, r.ConsumedCapacity, *r.ShareID)
		}
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

// With 32 workers in parallel, claims of a namespace with a quota are placed in creation
// order however they arrive and whichever frees quota: the placed claims are always the
// oldest of those not deleted, and the quota is never exceeded.
func TestQuotaQueueKeepsOrderInRunLoop(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewSimpleClientset(builders.MakeClass(api.DeviceClassShared), builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"))
	c := New(DefaultConfig(), client, fgpufake.NewSimpleClientset(builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("100Gi").Obj()), nil)
	go func() { _ = c.Run(ctx) }()
	const n = 30
	name := func(i int) string { return fmt.Sprintf("c%02d", i) }
	// Odd claims, youngest first, then even ones: younger claims often arrive first.
	var order []int
	for i := n - 1; i >= 0; i -= 2 {
		order = append(order, i)
	}
	for i := 0; i < n; i += 2 {
		order = append(order, i)
	}
	for _, i := range order {
		mem := "10Gi"
		if i%7 == 3 {
			mem = "25Gi"
		}
		if _, err := client.ResourceV1().ResourceClaims("a").Create(ctx, builders.MakeClaim("a", name(i)).Memory(mem).Created(i).Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.CoreV1().Pods("a").Create(ctx, builders.MakePod("a", name(i)).Claim(name(i)).Obj(), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deleted := map[string]bool{}
	placed := func() (used int64, names []string) {
		for i := range n {
			cl, err := client.ResourceV1().ResourceClaims("a").Get(ctx, name(i), metav1.GetOptions{})
			if err != nil || cl.Status.Allocation == nil {
				continue
			}
			q := cl.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]
			used += q.Value()
			names = append(names, name(i))
		}
		return used, names
	}
	// settled waits until the placed claims stop changing for a moment.
	settled := func() (int64, []string) {
		used, last := placed()
		for stable, deadline := 0, time.Now().Add(10*time.Second); stable < 10 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			u, now := placed()
			if slices.Equal(now, last) {
				stable++
			} else {
				stable, used, last = 0, u, now
			}
		}
		return used, last
	}
	for round := range 5 {
		used, names := settled()
		if used > 100<<30 {
			t.Fatalf("round %d: %s placed over the 100Gi quota: %v", round, fmtBytes(used), names)
		}
		var oldest []string
		for i := 0; i < n && len(oldest) < len(names); i++ {
			if !deleted[name(i)] {
				oldest = append(oldest, name(i))
			}
		}
		if !slices.Equal(names, oldest) {
			t.Fatalf("round %d: placed %v, want the oldest claims %v", round, names, oldest)
		}
		for _, p := range names[:min(3, len(names))] {
			_ = client.ResourceV1().ResourceClaims("a").Delete(ctx, p, metav1.DeleteOptions{})
			_ = client.CoreV1().Pods("a").Delete(ctx, p, metav1.DeleteOptions{})
			deleted[p] = true
		}
	}
}
