package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// BenchmarkDecideWithPreemption times the decision on a 10Gi claim of a namespace under the
// default isolation where every GPU of N nodes × 8 holds one 1Gi share of a namespace granted
// allowSharedGPU (the pinning tenant of issue 24): the decision fails, and the preemption plan
// takes the spread namespace's claims out of up to planGPUs of those GPUs, decides again and
// puts them back; plan=false is the failed decision alone. The difference is what planning
// adds to a waiting claim's retry while a namespace is spread over the whole fleet.
func BenchmarkDecideWithPreemption(b *testing.B) {
	for _, bc := range []struct {
		nodes int
		plan  bool
	}{{50, false}, {50, true}, {500, false}, {500, true}} {
		nodes := bc.nodes
		b.Run(fmt.Sprintf("nodes=%d/plan=%v", nodes, bc.plan), func(b *testing.B) {
			ctx := context.Background()
			c, claim, pods, class := benchController(b, nodes, DefaultConfig())
			spreadOverEveryGPU(c)
			sel := &input{claim: claim, classes: map[string]*resourceapi.DeviceClass{class.Name: class}}
			c.evaluateSelectors(ctx, sel)
			b.ResetTimer()
			for range b.N {
				in := &input{claim: claim, consumers: pods, pods: pods, pol: policy.Resolve(nil, nil, nil), avoid: map[string]bool{},
					classes: sel.classes, selectors: sel.selectors}
				c.model.Update(func(tx *model.Tx) {
					d, w := c.decider.decide(ctx, tx, in)
					if d != nil {
						b.Fatal("placed beside another namespace's share")
					}
					if !bc.plan {
						return
					}
					if w.preempt = c.preempt.plan(ctx, tx, in, c.decider); w.preempt == nil {
						b.Fatal("no GPU taken back from a namespace spread over every GPU")
					}
				})
			}
		})
	}
}

// spreadOverEveryGPU gives every GPU one 1Gi share of namespace "spread", granted
// allowSharedGPU.
func spreadOverEveryGPU(c *Controller) {
	i := 0
	c.model.Update(func(tx *model.Tx) {
		for g := range tx.GPUs() {
			key := fmt.Sprintf("spread/s%d", i)
			rec := model.NewClaim(types.UID(key), key, "spread", time.Time{})
			rec.AddShare(g, &model.Tenant{Claim: types.UID(key), Key: key, Namespace: "spread", ShareID: types.UID(key + "-share"),
				Mem: 1 << 30, AllowShare: true, ByUs: true, Mode: api.SharingModeMPS, Latency: api.LatencyStandard, Domain: model.Domain{Namespace: "spread"}})
			tx.Add(rec)
			i++
		}
	})
}
