package controller

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
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
	e.c.shares = &decisionShare{rate: 1, burst: 8, spaces: map[string]*shareBucket{}}
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
			if e.claim("greedy", fmt.Sprintf("c%d", i)).Annotations[AnnotationStatus] != "" {
				n++
			}
		}
		return n
	}
	before := decided()
	if before == 0 || before == 10 {
		t.Errorf("%d of 10 greedy claims decided; want some, until the share ran out", before)
	}
	e.clock.Step(wait + time.Minute)
	e.run()
	if after := decided(); after <= before {
		t.Errorf("%d greedy claims decided once the share came back, %d before", after, before)
	}
}
