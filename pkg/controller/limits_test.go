package controller

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// A memoryLimit or computePercent above what the claim is allocated is refused by the plugin
// at prepare: the allocator must refuse it before allocating, or choose a GPU where it fits.
func TestLimitsAboveTheAllocation(t *testing.T) {
	computeFromMemory := []*api.SharingPolicy{builders.MakePolicy("p").ComputeFromMemory().Obj()}
	for name, tc := range map[string]struct {
		policies []*api.SharingPolicy
		claim    *builders.ClaimBuilder
		slices   []runtime.Object
		placedOn string // "" when it must not be placed
		reason   string
		message  string
	}{
		"memoryLimit above the memory asked": {
			claim:   builders.MakeClaim("a", "c").Memory("10Gi").Config(map[string]any{"memoryLimit": "12Gi"}),
			reason:  ReasonUnsupported,
			message: `request "gpu": memoryLimit 12Gi is above the memory it asks (10Gi); lower the limit or ask for more memory`,
		},
		"memoryLimit above the memory asked once rounded": {
			claim:   builders.MakeClaim("a", "c").Memory("1000Mi").Config(map[string]any{"memoryLimit": "1100Mi"}),
			reason:  ReasonUnsupported,
			message: `memoryLimit 1100Mi is above the memory it asks (1000Mi, 1Gi once rounded up to the 256Mi step)`,
		},
		"memoryLimit within the rounded memory": {
			claim:    builders.MakeClaim("a", "c").Memory("1000Mi").Config(map[string]any{"memoryLimit": "1Gi"}),
			placedOn: "n1/gpu-0",
		},
		"computePercent above the compute asked": {
			claim:   builders.MakeClaim("a", "c").Memory("10Gi").Compute("20").Config(map[string]any{"computePercent": 30}),
			reason:  ReasonUnsupported,
			message: `request "gpu": computePercent 30 is above the compute it asks (20%); lower the limit or ask for more compute`,
		},
		"computePercent with no compute asked": {
			claim:    builders.MakeClaim("a", "c").Memory("10Gi").Config(map[string]any{"computePercent": 30}),
			placedOn: "n1/gpu-0",
		},
		"computePercent above the compute derived from memory": {
			policies: computeFromMemory,
			claim:    builders.MakeClaim("a", "c").Memory("8Gi").Config(map[string]any{"computePercent": 50}),
			reason:   ReasonWaiting,
			message:  "1 GPU(s): less compute than the claim's computePercent 50 (e.g. n1/gpu-0 gives 10%)",
		},
		"computePercent within the compute derived from memory": {
			policies: computeFromMemory,
			claim:    builders.MakeClaim("a", "c").Memory("8Gi").Config(map[string]any{"computePercent": 10}),
			placedOn: "n1/gpu-0",
		},
		"whole GPU smaller than memoryLimit": {
			claim:   builders.MakeClaim("a", "c").Class(api.DeviceClassExclusive).Config(map[string]any{"memoryLimit": "100Gi"}),
			reason:  ReasonWaiting,
			message: "1 GPU(s): less memory than the claim's memoryLimit 100Gi (e.g. n1/gpu-0 gives 80Gi)",
		},
		"whole GPU goes where memoryLimit fits": {
			claim:    builders.MakeClaim("a", "c").Class(api.DeviceClassExclusive).Config(map[string]any{"memoryLimit": "100Gi"}),
			slices:   []runtime.Object{builders.MakeNode("n2").Obj(), builders.MakeSlice("n2", 1, "141Gi")},
			placedOn: "n2/gpu-0",
		},
	} {
		t.Run(name, func(t *testing.T) {
			objs := append([]runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
				tc.claim.Obj(), builders.MakePod("a", "p").Claim("c").Obj()}, tc.slices...)
			e := newEnv(t, tc.policies, objs...)
			e.run()
			cl := e.claim("a", "c")
			if got := e.placedOn("a", "c"); got != tc.placedOn {
				t.Fatalf("placed on %q, want %q; status %q", got, tc.placedOn, cl.Annotations[api.AnnotationStatus])
			}
			if tc.placedOn != "" {
				return
			}
			if st := cl.Annotations[api.AnnotationStatus]; !strings.Contains(st, tc.message) {
				t.Errorf("status %q, want it to contain %q", st, tc.message)
			}
			if len(e.events(tc.reason+" ")) == 0 || len(e.events(tc.message)) == 0 {
				t.Errorf("no %s event says %q: %v", tc.reason, tc.message, e.events(""))
			}
		})
	}
}

// A SharingPolicy that does not validate is ignored, and says so in an event, instead of
// silently selecting nothing. One that sets a quota fails closed: the claims of the
// namespaces it may select wait, saying why, until it is fixed; a namespace that the
// valid part of its selector rules out is not held.
func TestInvalidPolicyIgnoredWithEvent(t *testing.T) {
	badIn := []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn}}
	badSelector := builders.MakePolicy("bad").QuotaMemory("1Gi").Obj()
	badSelector.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: badIn}
	otherTeam := builders.MakePolicy("bad").Namespaces("team", "other").QuotaMemory("1Gi").Obj()
	otherTeam.Spec.NamespaceSelector.MatchExpressions = badIn
	noQuota := builders.MakePolicy("bad").Isolation(api.IsolationExclusive).Obj()
	noQuota.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: badIn}
	const holds = "; the policy is ignored, and claims in the namespaces it may select wait until it is fixed (its quota cannot be enforced)"
	const ignored = "; the policy is ignored until it is fixed"
	for name, tc := range map[string]struct {
		pol        *api.SharingPolicy
		err, event string
		waits      bool
	}{
		"negative quota":                        {builders.MakePolicy("bad").QuotaMemory("-1Gi").Obj(), "quota.memory -1Gi must not be negative", holds, true},
		"invalid selector with a quota":         {badSelector, "namespaceSelector: ", holds, true},
		"namespace ruled out by the valid part": {otherTeam, "namespaceSelector: ", holds, false},
		"invalid selector without a quota":      {noQuota, "namespaceSelector: ", ignored, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []*api.SharingPolicy{tc.pol}, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
				builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
			e.run()
			prefix := "Warning " + ReasonInvalidPolicy + " SharingPolicy bad is invalid: " + tc.err
			if ev := e.events(prefix); len(ev) != 1 || !strings.HasSuffix(ev[0], tc.event) {
				t.Errorf("want one event %q...%q: %v", prefix, tc.event, e.events(""))
			}
			if !tc.waits {
				if got := e.placedOn("a", "c"); got == "" {
					t.Errorf("not placed: %s", e.claim("a", "c").Annotations[api.AnnotationStatus])
				}
				return
			}
			if got := e.placedOn("a", "c"); got != "" {
				t.Fatalf("placed on %s though SharingPolicy bad's quota cannot be enforced", got)
			}
			want := "Pending: SharingPolicy bad is invalid: " + tc.err
			if st := e.claim("a", "c").Annotations[api.AnnotationStatus]; !strings.Contains(st, want) || !strings.Contains(st, "its quota cannot be enforced, so claims it may bind wait until it is fixed") {
				t.Errorf("status %q does not say %q and why", st, want)
			}
			if len(e.events(ReasonInvalidPolicy+" claim c: "+want)) == 0 {
				t.Errorf("no %s event on the pod: %v", ReasonInvalidPolicy, e.events(""))
			}
			// Fixed, the policy binds again and the claim is placed within it.
			p := tc.pol.DeepCopy()
			p.Spec.NamespaceSelector = nil
			p.Spec.Quota.Memory = ptr.To(resource.MustParse("20Gi"))
			if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(10 * time.Second); e.placedOn("a", "c") == ""; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("not placed once the policy was fixed: %s", e.claim("a", "c").Annotations[api.AnnotationStatus])
				}
				e.run()
			}
		})
	}
}

// The allocator writes a SharingPolicy's Accepted condition when it changes, and only then.
func TestPolicyStatus(t *testing.T) {
	bad := builders.MakePolicy("bad").QuotaMemory("10Gi").Obj()
	bad.Generation = 3
	bad.Spec.PodSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}}}}
	e := newEnv(t, []*api.SharingPolicy{bad, builders.MakePolicy("good").Obj()})
	accepted := func(name string) *metav1.Condition {
		t.Helper()
		p, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return meta.FindStatusCondition(p.Status.Conditions, api.ConditionAccepted)
	}
	writes := func() int {
		n := 0
		for _, a := range e.fgpu.Actions() {
			if a.GetVerb() == "update" && a.GetSubresource() == "status" {
				n++
			}
		}
		return n
	}
	e.syncPolicies()
	c := accepted("bad")
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != api.ReasonInvalidSelector || c.ObservedGeneration != 3 ||
		!strings.HasPrefix(c.Message, "podSelector: ") || !strings.Contains(c.Message, "claims in the namespaces it may select wait until it is fixed") {
		t.Errorf("bad: Accepted %+v", c)
	}
	if c := accepted("good"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != api.ReasonValid {
		t.Errorf("good: Accepted %+v", c)
	}
	if n := writes(); n != 2 {
		t.Fatalf("%d status writes, want 2", n)
	}
	// The informer shows the writes; nothing changed, so nothing is written again.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		p, _ := e.c.policies.Get("bad")
		if p != nil && len(p.Status.Conditions) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see the status it wrote")
		}
	}
	e.syncPolicies()
	if n := writes(); n != 2 {
		t.Errorf("%d status writes after a sync that changed nothing, want 2", n)
	}
	if ev := e.events(ReasonInvalidPolicy); len(ev) != 1 {
		t.Errorf("want one %s event: %v", ReasonInvalidPolicy, ev)
	}
	// Fixed: Accepted turns True.
	p, _ := e.c.policies.Get("bad")
	p = p.DeepCopy()
	p.Spec.PodSelector = nil
	p.Generation = 4
	if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if got, _ := e.c.policies.Get("bad"); got != nil && got.Generation == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see the fixed policy")
		}
	}
	e.syncPolicies()
	if c := accepted("bad"); c == nil || c.Status != metav1.ConditionTrue || c.Reason != api.ReasonValid || c.ObservedGeneration != 4 {
		t.Errorf("fixed: Accepted %+v", c)
	}
}
