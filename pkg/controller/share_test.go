package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// A namespace whose claims fit nowhere spends its share of decisions and waits, checking no
// more GPUs under the model's lock; another namespace's claim is still placed, and the
// first's claims are decided again once its share has come back.
func TestDecisionShareHoldsBackANamespaceThatChecksTooMuch(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi")}
	for i := range 10 {
		name := fmt.Sprintf("c%d", i)
		objs = append(objs, builders.MakeClaim("greedy", name).Memory("200Gi").Created(i).Obj(), builders.MakePod("greedy", "p"+name).Claim(name).Obj())
	}
	objs = append(objs, builders.MakeClaim("victim", "c").Memory("10Gi").Created(20).Obj(), builders.MakePod("victim", "p").Claim("c").Obj())
	e := newEnv(t, nil, objs...)
	e.c.shares = &decisionShare{rate: 1, burst: 3 * decisionFloor, spaces: map[string]*shareBucket{}}
	e.run()
	if e.placedOn("victim", "c") == "" {
		t.Fatal("the victim was not placed")
	}
	wait := e.c.shares.Wait("greedy", e.clock.Now())
	if wait <= 0 {
		t.Fatal("the greedy namespace did not spend its share")
	}
	decided := func() int {
		n := 0
		for i := range 10 {
			if e.claim("greedy", fmt.Sprintf("c%d", i)).Annotations[api.AnnotationStatus] != "" {
				n++
			}
		}
		return n
	}
	before := decided()
	if before == 0 || before == 10 {
		t.Errorf("%d of 10 greedy claims decided; want some, until the share ran out", before)
	}
	e.clock.Step(wait + time.Hour)
	if e.c.shares.Wait("greedy", e.clock.Now()) > 0 {
		t.Fatal("the share did not come back")
	}
	e.run()
	if e.c.shares.Wait("greedy", e.clock.Now()) == 0 {
		t.Error("the greedy namespace decided nothing once its share came back")
	}
	if after := decided(); after < before {
		t.Errorf("%d greedy claims decided, %d before", after, before)
	}
}

// Finding 5 of issue 24 through the pod count: a tenant that fills a node's pod slots with
// pods bound to it leaves no slot for the MPS daemon another namespace's share needs, so the
// allocator keeps one free: the share goes to a node with room, and waits where none has.
func TestAShareKeepsAPodSlotForItsMPSDaemon(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("full").Pods(3).Obj(), builders.MakeSlice("full", 1, "80Gi")}
	for i := range 2 {
		objs = append(objs, builders.MakePod("tenant", fmt.Sprintf("filler%d", i)).Bound("full").Obj())
	}
	objs = append(objs, builders.MakeClaim("victim", "c").Memory("10Gi").Obj(), builders.MakePod("victim", "p").Claim("c").Obj())
	e := newEnv(t, nil, objs...)
	e.run()
	if got := e.placedOn("victim", "c"); got != "" {
		t.Fatalf("placed on %s, a node with one pod slot left for the pod and its MPS daemon", got)
	}
	if st := e.claim("victim", "c").Annotations[api.AnnotationStatus]; !strings.Contains(st, "too many pods") {
		t.Errorf("status %q does not say the node has too many pods", st)
	}
	e.create(builders.MakeNode("roomy").Pods(2).Obj(), builders.MakeSlice("roomy", 1, "80Gi"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		gpus := 0
		e.c.model.EachGPU(func(*model.GPU) { gpus++ })
		if _, err := e.c.nodes.Get("roomy"); err == nil && gpus == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see node roomy and its GPU")
		}
	}
	e.run()
	if got := e.placedOn("victim", "c"); got != "roomy/gpu-0" {
		t.Errorf("placed on %q, want roomy/gpu-0", got)
	}
}

// Review of issue 24: pod-fit work was neither charged nor bounded. A claim used by many
// pods, each naming many claims, made every node the filter reached look up every name
// under the model's lock, and was charged one check per GPU. The pods' other claims are now
// looked up once, before the lock, and every pod and allocated claim checked on a node is
// charged to the namespace's share.
func TestPodFitWorkIsChargedToItsNamespace(t *testing.T) {
	onN1 := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
		{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"n1"}}}}}}
	other := builders.MakeClaim("a", "other").Memory("1Gi").Obj()
	other.Spec.Devices.Requests[0].Exactly.DeviceClassName = "other.example.com"
	other.Status.Allocation = &resourceapi.AllocationResult{NodeSelector: onN1}
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), other,
		builders.MakeClaim("a", "shared").Memory("10Gi").Obj()}
	const pods = 40
	for i := range pods {
		p := builders.MakePod("a", fmt.Sprintf("p%d", i)).Claim("shared").Claim("other")
		for j := range 50 {
			p = p.Claim(fmt.Sprintf("missing-%d", j))
		}
		objs = append(objs, p.Obj())
	}
	e := newEnv(t, nil, objs...)
	const burst = 1e9
	e.c.shares = &decisionShare{rate: 1, burst: burst, spaces: map[string]*shareBucket{}}
	e.run()
	if e.placedOn("a", "shared") != "n1/gpu-0" {
		t.Fatalf("not placed: %s", e.claim("a", "shared").Annotations[api.AnnotationStatus])
	}
	b := e.c.shares.spaces["a"]
	if b == nil {
		t.Fatal("namespace a was charged nothing")
	}
	// One GPU checked, and on its node every pod and its one allocated other claim.
	if charged, least := burst-b.tokens, float64(decisionFloor+1+2*pods); charged < least {
		t.Errorf("namespace a charged %.0f checks for a decision over %d pods with another claim each; want at least %.0f", charged, pods, least)
	}
}
