package controller

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// A tenant strips both finalizers and deletes its claim in the next request, before the
// allocator restores them (or admission is not installed). The claim is gone at once, but the
// kubelet does not stop its pod: the share and the namespace's quota usage stay counted until
// the pod ends, and a new claim of the same name is accounted on its own.
func TestClaimDeletedWhilePodRunsKeepsShareUntilPodEnds(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeClaim("a", "c").Memory("40Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if e.placedOn("a", "c") != "n1/gpu-0" {
		t.Fatal("not placed")
	}
	// The pod is bound and running; the claim is reserved for it.
	p, _ := e.client.CoreV1().Pods("a").Get(e.ctx, "p", metav1.GetOptions{})
	p.Spec.NodeName = "n1"
	_, _ = e.client.CoreV1().Pods("a").Update(e.ctx, p, metav1.UpdateOptions{})
	c := e.claim("a", "c")
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "p", UID: p.UID}}
	_, _ = e.client.ResourceV1().ResourceClaims("a").UpdateStatus(e.ctx, c, metav1.UpdateOptions{})
	e.run()
	e.tamper("a", "c", func(c *resourceapi.ResourceClaim) { c.Finalizers = nil })
	_ = e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "c", metav1.DeleteOptions{})
	e.run()
	// The claim's delete handler holds the share, then tells the pod.
	if ev := e.awaitEvents(ReasonClaimDeletedInUse, 1); len(ev) != 1 || !strings.Contains(ev[0], "keeps the share") {
		t.Errorf("events %v", ev)
	}
	used := func() int64 {
		return e.charged("a").Mem
	}
	if got := used(); got != 40<<30 {
		t.Fatalf("pod a/p still runs on a 40Gi share of n1/gpu-0, but namespace a counts %d bytes", got)
	}
	// A new claim of the same name gets what the GPU has left, not the held share.
	e.create(builders.MakeClaim("a", "c").Memory("60Gi").Created(5).Obj(), builders.MakePod("a", "p2").Claim("c").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("a 60Gi claim was placed on %s, where a running pod holds 40Gi of 80Gi", got)
	}
	_ = e.client.CoreV1().Pods("a").Delete(e.ctx, "p", metav1.DeleteOptions{})
	e.settle()
	if got := used(); got != 0 {
		t.Errorf("the pod is gone, but namespace a still counts %d bytes", got)
	}
	e.run()
	if got := e.placedOn("a", "c"); got != "n1/gpu-0" || used() != 60<<30 {
		t.Errorf("after the pod ended the new claim is on %q and namespace a counts %d bytes", got, used())
	}
}
