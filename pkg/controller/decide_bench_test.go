package controller

import (
	"context"
	"fmt"
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
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			o := loadgen.Defaults()
			o.Nodes, o.Claims = nodes, 1
			client := fake.NewSimpleClientset() // NewClientset's field management would dominate the setup
			if err := loadgen.Setup(ctx, client, o); err != nil {
				b.Fatal(err)
			}
			if err := loadgen.CreateAll(ctx, client, o); err != nil {
				b.Fatal(err)
			}
			c := New(DefaultConfig(), client, nil, nil)
			if !c.WaitForCacheSync(ctx) {
				b.Fatal("caches did not sync")
			}
			claim, err := c.claims.ResourceClaims(o.Namespace).Get(o.Claim(0).Name)
			for ; err != nil || len(c.consumers(claim)) == 0; claim, err = c.claims.ResourceClaims(o.Namespace).Get(o.Claim(0).Name) {
				time.Sleep(10 * time.Millisecond)
			}
			pods := c.consumers(claim)
			class, err := c.classes.Get(o.Class)
			if err != nil {
				b.Fatal(err)
			}
			once := func() {
				in := &input{claim: claim, consumers: pods, pods: pods, pol: policy.Resolve(nil, nil, nil), avoid: map[string]bool{},
					classes: map[string]*resourceapi.DeviceClass{o.Class: class}}
				d, w := c.decide(ctx, in)
				if w != nil {
					b.Fatal(w.message)
				}
				c.model.remove(d.rec.key)
			}
			c.model.mu.Lock() // as the worker holds it while deciding
			defer c.model.mu.Unlock()
			// The slice handlers run after the informers report synced: wait until the
			// model holds every node.
			for deadline := time.Now().Add(time.Minute); ; {
				once()
				if len(c.model.coreGPU) == nodes {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("the model holds %d of %d nodes", len(c.model.coreGPU), nodes)
				}
				c.model.mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				c.model.mu.Lock()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				once()
			}
		})
	}
}
