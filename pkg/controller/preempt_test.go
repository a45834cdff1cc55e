package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// pinned is a 1Gi claim of namespace ns that its selectors pin to GPU index, and its pod.
func pinned(ns, name string, index, created int) []runtime.Object {
	c := builders.MakeClaim(ns, name).Memory("1Gi").Created(created).Obj()
	c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, index))
	return []runtime.Object{c, builders.MakePod(ns, name).Claim(name).Obj()}
}

// Issue #24, M4: a namespace granted allowSharedGPU that pins one small share to each GPU kept
// every claim that does not share across namespaces off them, uncharged. A claim of a
// namespace under the default isolation that waits takes back a GPU the spread namespace
// holds beyond its shares' need: the pod there is marked disrupted and deleted, the GPU is
// kept for the waiting claim (not for the tenant's pinned pod that comes back first), and
// the claim is placed there once the share is gone. The namespace keeps the one GPU its
// shares need: another waiting claim takes nothing more.
func TestSpreadSharedNamespaceGivesBackWhatItDoesNotNeed(t *testing.T) {
	pols := []*api.SharingPolicy{builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().Obj()}
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		namespaceObj("spread"), namespaceObj("team"), namespaceObj("other")}
	objs = append(objs, pinned("spread", "s0", 0, 0)...)
	objs = append(objs, pinned("spread", "s1", 1, 1)...)
	e := newEnv(t, pols, objs...)
	e.run()
	if e.placedOn("spread", "s0") != "n1/gpu-0" || e.placedOn("spread", "s1") != "n1/gpu-1" {
		t.Fatalf("pinned shares on %q and %q", e.placedOn("spread", "s0"), e.placedOn("spread", "s1"))
	}
	e.create(builders.MakeClaim("team", "big").Memory("40Gi").Created(10).Obj(), builders.MakePod("team", "big").Claim("big").Obj())
	e.run()
	if got := e.placedOn("team", "big"); got != "" {
		t.Fatalf("placed on %s beside another namespace's share without allowSharedGPU", got)
	}
	st := e.claim("team", "big").Annotations[api.AnnotationStatus]
	var taken, left string
	switch {
	case strings.Contains(st, "taking back n1/gpu-0"):
		taken, left = "s0", "s1"
	case strings.Contains(st, "taking back n1/gpu-1"):
		taken, left = "s1", "s0"
	default:
		t.Fatalf("status of the waiting claim %q does not say which GPU is taken back", st)
	}
	if _, err := e.client.CoreV1().Pods("spread").Get(e.ctx, taken, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod %s on the GPU taken back is not deleted: %v", taken, err)
	}
	if _, err := e.client.CoreV1().Pods("spread").Get(e.ctx, left, metav1.GetOptions{}); err != nil {
		t.Errorf("pod %s, on the GPU the namespace needs, is gone: %v", left, err)
	}
	marked := false
	for _, a := range e.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && p.GetSubresource() == "status" && p.GetName() == taken &&
			strings.Contains(string(p.GetPatch()), `"DisruptionTarget"`) && strings.Contains(string(p.GetPatch()), PodReasonPreemptionByFgpu) {
			marked = true
		}
	}
	if !marked {
		t.Error("the preempted pod was not marked DisruptionTarget before its deletion")
	}
	leftGPU := map[string]string{"s0": "n1/gpu-0", "s1": "n1/gpu-1"}[left]
	if ev := e.events(ReasonPreempted); len(ev) != 1 || !strings.Contains(ev[0], "fits beside namespace spread's other shares on GPU "+leftGPU) || strings.Contains(ev[0], "team") {
		t.Errorf("events on the preempted pod: %q (want one that says why, without naming the waiting namespace)", ev)
	}
	if got := testutil.ToFloat64(e.c.metrics.preempted.WithLabelValues("spread")); got != 1 {
		t.Errorf("fgpu_allocator_preempted_pods_total{namespace=spread} = %v", got)
	}
	// The tenant's pod comes back first, pinned to the same GPU, with a claim older than the
	// waiting one; the GPU is kept for the claim it was freed for.
	if err := e.client.ResourceV1().ResourceClaims("spread").Delete(e.ctx, taken, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	gpu := map[string]int{"s0": 0, "s1": 1}[taken]
	e.create(pinned("spread", taken+"-again", gpu, 5)...)
	e.run()
	if got := e.placedOn("team", "big"); got != fmt.Sprintf("n1/gpu-%d", gpu) {
		t.Errorf("the waiting claim is on %q, want the GPU taken back for it (n1/gpu-%d)", got, gpu)
	}
	if got := e.placedOn("spread", taken+"-again"); got != "" {
		t.Errorf("the tenant's recreated pinned claim took %s back", got)
	}
	// The namespace's last share is what it needs: nothing more is taken.
	e.create(builders.MakeClaim("other", "big").Memory("40Gi").Created(20).Obj(), builders.MakePod("other", "big").Claim("big").Obj())
	e.run()
	if got := e.placedOn("other", "big"); got != "" {
		t.Errorf("placed on %s", got)
	}
	if st := e.claim("other", "big").Annotations[api.AnnotationStatus]; strings.Contains(st, "taking back") {
		t.Errorf("a namespace on the one GPU its shares need is preempted: %q", st)
	}
	if _, err := e.client.CoreV1().Pods("spread").Get(e.ctx, left, metav1.GetOptions{}); err != nil {
		t.Errorf("pod %s, on the one GPU its namespace needs, is gone: %v", left, err)
	}
	if ev := e.events(ReasonPreempted); len(ev) != 1 {
		t.Errorf("%d preemptions, want 1", len(ev))
	}
}

// Nothing is taken back from shares that could not fit beside their namespace's others
// (50Gi on each of two 80Gi GPUs), from shares of a higher latency class than the waiting
// claim's (standard, for a best-effort claim), or for a claim over its own quota.
func TestNoPreemptionWhereNothingIsHeldForNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		victims     func() []runtime.Object
		waiterClass api.LatencyClass
		waiterQuota string
	}{
		"shares too large to fit beside each other": {victims: func() []runtime.Object {
			var objs []runtime.Object
			for i := range 2 {
				c := builders.MakeClaim("spread", fmt.Sprint("s", i)).Memory("50Gi").Created(i).Obj()
				objs = append(objs, c, builders.MakePod("spread", c.Name).Claim(c.Name).Obj())
			}
			return objs
		}},
		"standard shares, a best-effort claim": {waiterClass: api.LatencyBestEffort},
		"a claim over its own quota":           {waiterQuota: "10Gi"},
	} {
		t.Run(name, func(t *testing.T) {
			pols := []*api.SharingPolicy{builders.MakePolicy("shared").Namespaces("kubernetes.io/metadata.name", "spread").AllowShared().Obj()}
			team := builders.MakePolicy("team").Namespaces("kubernetes.io/metadata.name", "team")
			if tc.waiterClass != "" {
				team = team.Latency(tc.waiterClass)
			}
			if tc.waiterQuota != "" {
				team = team.QuotaMemory(tc.waiterQuota)
			}
			pols = append(pols, team.Obj())
			objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("spread"), namespaceObj("team")}
			if tc.victims != nil {
				objs = append(objs, tc.victims()...)
			} else {
				objs = append(objs, pinned("spread", "s0", 0, 0)...)
				objs = append(objs, pinned("spread", "s1", 1, 1)...)
			}
			objs = append(objs, builders.MakeClaim("team", "w").Memory("20Gi").Created(10).Obj(), builders.MakePod("team", "w").Claim("w").Obj())
			e := newEnv(t, pols, objs...)
			e.run()
			if e.placedOn("spread", "s0") == "" || e.placedOn("spread", "s1") == "" || e.placedOn("spread", "s0") == e.placedOn("spread", "s1") {
				t.Fatalf("the shares are on %q and %q, want one GPU each", e.placedOn("spread", "s0"), e.placedOn("spread", "s1"))
			}
			if st := e.claim("team", "w").Annotations[api.AnnotationStatus]; e.placedOn("team", "w") != "" || strings.Contains(st, "taking back") {
				t.Errorf("the waiting claim got %q, status %q", e.placedOn("team", "w"), st)
			}
			if ev := e.events(ReasonPreempted); len(ev) != 0 {
				t.Errorf("preempted: %q", ev)
			}
		})
	}
}

// A plan tries at most planGPUs of the GPUs that may be taken back, the next ones at the
// next retry: over 80 spread GPUs, a claim whose pod fits only the last node (its GPUs sort
// last) finds none in the first plan and one there in the second.
func TestPreemptionPlansAWindowAtATime(t *testing.T) {
	ctx := context.Background()
	c, claim, pods, class := benchController(t, 10, DefaultConfig())
	spreadOverEveryGPU(t, c)
	pod := pods[0].DeepCopy()
	pod.Spec.NodeSelector = map[string]string{"kubernetes.io/hostname": "bench-node-0009"}
	sel := &input{claim: claim, classes: map[string]*resourceapi.DeviceClass{class.Name: class}}
	c.evaluateSelectors(ctx, sel)
	var plans []*preemption
	for range 2 {
		in := &input{claim: claim, consumers: []*corev1.Pod{pod}, pods: []*corev1.Pod{pod}, pol: policy.Resolve(nil, nil, nil), avoid: map[string]bool{},
			classes: sel.classes, selectors: sel.selectors}
		c.model.Update(func(tx *model.Tx) {
			plans = append(plans, c.preempt.plan(ctx, tx, in, c.decider, &waitReason{keptOff: true}))
		})
	}
	if plans[0] != nil {
		t.Errorf("the first plan, over the first %d GPUs, took back %v", planGPUs, plans[0].gpus)
	}
	if plans[1] == nil || len(plans[1].gpus) != 1 || plans[1].gpus[0].Pool != "bench-node-0009" {
		t.Fatalf("the second plan took back %+v, want one GPU of bench-node-0009", plans[1])
	}
	if v := plans[1].victims; len(v) != 1 || v[0].on != plans[1].gpus[0] || v[0].beside == v[0].on {
		t.Errorf("victims %+v", v)
	}
}
