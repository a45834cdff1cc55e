package controller

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/fgpu-dev/fgpu/pkg/policy"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// BenchmarkDecide times one placement decision (pod fit, device checks and the fgpu
// policy, over the nodes the state index leaves) for a 10Gi claim on N empty nodes × 8
// GPUs: decisions are
// serialised, so this bounds the allocator's claims per second on a cluster that size.
func BenchmarkDecide(b *testing.B) {
	for _, nodes := range []int{500, 2000} {
		b.Run(fmt.Sprintf("nodes=%d", nodes), func(b *testing.B) {
			once := decider(b, nodes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				once()
			}
		})
	}
}

// TestDecideMemoryDoesNotGrowWithNodes: a decision that asks the filter about a few nodes
// allocates as much on 2,000 nodes as on 500 (its pod-fit memo is not sized by the fleet,
// which cost a 10,917-node decision 185 KB and a share of the collector's work).
func TestDecideMemoryDoesNotGrowWithNodes(t *testing.T) {
	perDecision := func(nodes int) uint64 {
		once := decider(t, nodes)
		var before, after runtime.MemStats
		const n = 50
		runtime.ReadMemStats(&before)
		for range n {
			once()
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / n
	}
	small, large := perDecision(500), perDecision(2000)
	if large > small+4<<10 {
		t.Fatalf("a decision allocates %d bytes on 500 nodes and %d on 2,000: it should not grow with the fleet", small, large)
	}
}

// decider sets up a controller over nodes empty nodes × 8 GPUs and returns one decision on
// a 10Gi claim there (undone after it), to be called as the worker calls decide: the model's
// lock is held from here to the end of the test.
func decider(tb testing.TB, nodes int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	o := loadgen.Defaults()
	o.Nodes, o.Claims = nodes, 1
	client := fake.NewSimpleClientset() // NewClientset's field management would dominate the setup
	if err := loadgen.Setup(ctx, client, o); err != nil {
		tb.Fatal(err)
	}
	if err := loadgen.CreateAll(ctx, client, o); err != nil {
		tb.Fatal(err)
	}
	c := New(DefaultConfig(), client, nil, nil)
	if !c.WaitForCacheSync(ctx) {
		tb.Fatal("caches did not sync")
	}
	claim, err := c.claims.ResourceClaims(o.Namespace).Get(o.Claim(0).Name)
	for ; err != nil || len(c.consumers(claim)) == 0; claim, err = c.claims.ResourceClaims(o.Namespace).Get(o.Claim(0).Name) {
		time.Sleep(10 * time.Millisecond)
	}
	pods := c.consumers(claim)
	class, err := c.classes.Get(o.Class)
	if err != nil {
		tb.Fatal(err)
	}
	// The slice handlers run after the informers report synced: wait until the model
	// holds every GPU, and evaluate the claim's selectors on them, as gather does before
	// the decision takes the lock.
	sel := &input{claim: claim, classes: map[string]*resourceapi.DeviceClass{o.Class: class}}
	for deadline := time.Now().Add(time.Minute); len(c.model.SelectorDevices()) < nodes*o.GPUsPerNode; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatalf("the model holds %d of %d GPUs", len(c.model.SelectorDevices()), nodes*o.GPUsPerNode)
		}
	}
	c.evaluateSelectors(ctx, sel)
	once := func() {
		in := &input{claim: claim, consumers: pods, pods: pods, pol: policy.Resolve(nil, nil, nil), avoid: map[string]bool{},
			classes: sel.classes, selectors: sel.selectors}
		d, w := c.decide(ctx, in)
		if w != nil {
			tb.Fatal(w.message)
		}
		c.model.remove(d.rec.key)
	}
	c.model.mu.Lock() // as the worker holds it while deciding
	tb.Cleanup(c.model.mu.Unlock)
	once()
	if len(c.model.coreGPU) != nodes {
		tb.Fatalf("the model holds %d of %d nodes", len(c.model.coreGPU), nodes)
	}
	return once
}
