package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

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
				t.Fatalf("placed on %q, want %q; status %q", got, tc.placedOn, cl.Annotations[AnnotationStatus])
			}
			if tc.placedOn != "" {
				return
			}
			if st := cl.Annotations[AnnotationStatus]; !strings.Contains(st, tc.message) {
				t.Errorf("status %q, want it to contain %q", st, tc.message)
			}
			if len(e.events(tc.reason+" ")) == 0 || len(e.events(tc.message)) == 0 {
				t.Errorf("no %s event says %q: %v", tc.reason, tc.message, e.events(""))
			}
		})
	}
}

// A SharingPolicy that does not validate is ignored, and says so in an event, instead of
// silently selecting nothing or holding every claim of a namespace over a negative quota.
func TestInvalidPolicyIgnoredWithEvent(t *testing.T) {
	badSelector := builders.MakePolicy("bad").QuotaMemory("1Gi").Obj()
	badSelector.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn}}}
	for name, tc := range map[string]struct {
		pol  *api.SharingPolicy
		want string
	}{
		"negative quota":   {builders.MakePolicy("bad").QuotaMemory("-1Gi").Obj(), "quota.memory -1Gi must not be negative"},
		"invalid selector": {badSelector, "namespaceSelector: "},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []*api.SharingPolicy{tc.pol}, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
				builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
			e.run()
			if got := e.placedOn("a", "c"); got == "" {
				t.Errorf("not placed: %s", e.claim("a", "c").Annotations[AnnotationStatus])
			}
			want := "Warning " + ReasonInvalidPolicy + " SharingPolicy bad is ignored until it is fixed (no claim is placed under it, its quota binds no one): " + tc.want
			if len(e.events(want)) == 0 {
				t.Errorf("no event %q: %v", want, e.events(""))
			}
		})
	}
}
