package controller

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	fgpulisters "github.com/fgpu-dev/fgpu/pkg/client/listers/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// BenchmarkDecideWithReclaim times the decision on a 10Gi claim of a namespace under the
// default isolation where every GPU of N nodes × 8 holds one 1Gi share of a namespace granted
// allowSharedGPU with a 4Gi quota (the pinning tenant of issue 24): the decision fails, and
// the plan finds the namespace's loan, checks that the shares of up to reclaimGPUs of its GPUs
// would move beside its others, and decides again on the cheapest of them with their claims
// taken out; plan=false is the failed decision alone. The difference is what planning adds to
// a waiting claim's retry while a namespace is spread over the whole fleet.
func BenchmarkDecideWithReclaim(b *testing.B) {
	for _, bc := range []struct {
		nodes int
		plan  bool
	}{{50, false}, {50, true}, {500, false}, {500, true}} {
		b.Run(fmt.Sprintf("nodes=%d/plan=%v", bc.nodes, bc.plan), func(b *testing.B) {
			ctx := context.Background()
			c, claim, pods, class := benchController(b, bc.nodes, DefaultConfig())
			spreadOverEveryGPU(b, c, "4Gi")
			sel := &input{claim: claim, classes: map[string]*resourceapi.DeviceClass{class.Name: class}}
			c.evaluateSelectors(ctx, sel)
			b.ResetTimer()
			for range b.N {
				in := &input{claim: claim, consumers: pods, pods: pods, pol: policy.Resolve(nil, nil, nil), avoid: map[string]bool{},
					classes: sel.classes, selectors: sel.selectors}
				// Each retry plans anew, as if the last plan's victims were gone.
				c.reclaim.kept, c.reclaim.taken = map[model.GPUKey]keptGPU{}, map[model.GPUKey]takenGPU{}
				c.model.Update(func(tx *model.Tx) {
					d, w := c.decider.decide(ctx, tx, in)
					if d != nil {
						b.Fatal("placed beside another namespace's share")
					}
					if !bc.plan {
						return
					}
					if w.reclaim = c.reclaim.plan(ctx, tx, in, c.decider, w); w.reclaim == nil {
						b.Fatal("no GPU taken back from a namespace spread over every GPU")
					}
				})
			}
		})
	}
}

// spreadOverEveryGPU gives every GPU one 1Gi share of namespace "spread", granted
// allowSharedGPU with the memory quota given, each of its own claim from a pod's template.
func spreadOverEveryGPU(tb testing.TB, c *Controller, quota string) {
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "spread", Labels: map[string]string{"kubernetes.io/metadata.name": "spread"}}}
	if _, err := c.client.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		tb.Fatal(err)
	}
	policies := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := policies.Add(builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().QuotaMemory(quota).Obj()); err != nil {
		tb.Fatal(err)
	}
	c.reclaim.policies = fgpulisters.NewSharingPolicyLister(policies)
	var gpus []*model.GPU
	c.model.Update(func(tx *model.Tx) {
		for g := range tx.GPUs() {
			gpus = append(gpus, g)
		}
	})
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "p", UID: "p", Controller: ptr.To(true)}
	for i := range gpus {
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "spread", Name: fmt.Sprintf("s%d", i), UID: types.UID(fmt.Sprintf("spread/s%d", i)),
			OwnerReferences: []metav1.OwnerReference{owner}}}
		if _, err := c.client.ResourceV1().ResourceClaims("spread").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			tb.Fatal(err)
		}
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		l, _ := c.claims.ResourceClaims("spread").List(labels.Everything())
		if _, err := c.namespaces.Get("spread"); err == nil && len(l) == len(gpus) {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatal("the informers do not show the spread namespace and its claims")
		}
	}
	c.model.Update(func(tx *model.Tx) {
		for i, g := range gpus {
			key := fmt.Sprintf("spread/s%d", i)
			rec := model.NewClaim(types.UID(key), key, "spread", time.Time{})
			rec.AddShare(g, &model.Tenant{Claim: types.UID(key), Key: key, Namespace: "spread", ShareID: types.UID(key + "-share"),
				Mem: 1 << 30, AllowShare: true, ByUs: true, Mode: api.SharingModeMPS, Latency: api.LatencyStandard, Domain: model.Domain{Namespace: "spread"}})
			tx.Add(rec)
		}
	})
}
