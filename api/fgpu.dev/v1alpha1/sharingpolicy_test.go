package v1alpha1

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/cel"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

func TestSharingPolicySpecValidate(t *testing.T) {
	bad := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: "In"}}}
	for name, tc := range map[string]struct {
		spec SharingPolicySpec
		want string // "" when valid
	}{
		"empty":                     {SharingPolicySpec{}, ""},
		"zero quota":                {SharingPolicySpec{Quota: &Quota{Memory: ptr.To(resource.MustParse("0")), Compute: ptr.To[int64](0)}}, ""},
		"valid selectors and quota": {SharingPolicySpec{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}, Quota: &Quota{Memory: ptr.To(resource.MustParse("80Gi"))}}, ""},
		"negative memory quota":     {SharingPolicySpec{Quota: &Quota{Memory: ptr.To(resource.MustParse("-1Gi"))}}, "quota.memory -1Gi must not be negative"},
		"negative compute quota":    {SharingPolicySpec{Quota: &Quota{Compute: ptr.To[int64](-5)}}, "quota.compute -5 must not be negative"},
		"held room refused alone":   {SharingPolicySpec{Quota: &Quota{HeldRoom: HeldRoomRefuse}}, ""},
		"unknown held room rule":    {SharingPolicySpec{Quota: &Quota{HeldRoom: "Ignore"}}, `quota.heldRoom "Ignore" must be "Charge" or "Refuse"`},
		"In without values":         {SharingPolicySpec{NamespaceSelector: bad}, "namespaceSelector: "},
		"invalid pod selector":      {SharingPolicySpec{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}}, "podSelector: "},
		"idle after 10m, SM unset":  {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: 10 * time.Minute}}}, ""},
		"idle after 30m below 5%":   {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: 30 * time.Minute}, SMBelowPercent: 5}}, ""},
		"idle after 1m":             {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: time.Minute}}}, ""},
		"idle after under 1m":       {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: 59 * time.Second}}}, "idleScaleDown.after 59s must be at least 1m0s"},
		"idle after unset":          {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{}}, "idleScaleDown.after 0s must be at least"},
		"idle SM above 100":         {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: time.Hour}, SMBelowPercent: 101}}, "smBelowPercent 101 must be between 1 and 100"},
		"idle SM negative":          {SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: time.Hour}, SMBelowPercent: -1}}, "smBelowPercent -1 must be between"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.spec.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("valid spec refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// An invalid policy's Accepted message is the same on every call: it goes to the policy's
// status, and a message that changed would write status (and an event) again on the update
// that write causes. With several bad matchLabels keys, the first one in key order is named.
func TestAcceptedMessageDeterministic(t *testing.T) {
	p := &SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "p", Generation: 1}}
	p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"bad key c": "z", "bad key a": "x", "bad key b": "y"}}
	first := p.Accepted().Message
	if !strings.Contains(first, `"bad key a"`) {
		t.Fatalf("message %q does not name the first bad key in order", first)
	}
	for i := 0; i < 200; i++ {
		if m := p.Accepted().Message; m != first {
			t.Fatalf("Accepted message changes between calls:\n%s\n%s", first, m)
		}
	}
}

// A policy stored before the CRD refused it, that grants privileges to pods its podSelector
// alone selects, is not accepted, and its condition says what grants what and how to fix it.
func TestAcceptedRefusesUnboundPrivileges(t *testing.T) {
	p := &SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "critical-serving", Generation: 3}}
	p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"fgpu.dev/latency": "critical"}}
	p.Spec.LatencyClass, p.Spec.AllowSharedGPU = LatencyCritical, true
	c := p.Accepted()
	if c.Status != metav1.ConditionFalse || c.Reason != ReasonUnboundPrivileges || c.ObservedGeneration != 3 {
		t.Fatalf("condition %+v", c)
	}
	for _, want := range []string{"latencyClass critical, allowSharedGPU", "applies to no pod", "add a namespaceSelector"} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("message %q does not say %q", c.Message, want)
		}
	}
	p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "serving"}}
	if c := p.Accepted(); c.Status != metav1.ConditionTrue {
		t.Errorf("bound to namespaces: %+v", c)
	}
}

// The CRD's rule on quota.memory, evaluated as the API server would: the value is an int or
// a string (x-kubernetes-int-or-string).
func TestCRDRefusesNegativeMemoryQuota(t *testing.T) {
	raw, err := os.ReadFile("../../../deployments/helm/fgpu/crds/fgpu.dev_sharingpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var crd struct {
		Spec struct {
			Versions []struct {
				Schema struct {
					OpenAPIV3Schema struct {
						Properties struct {
							Spec struct {
								Properties struct {
									Quota struct {
										Properties struct {
											Memory struct {
												Rules []struct{ Rule, Message string } `json:"x-kubernetes-validations"`
											} `json:"memory"`
										} `json:"properties"`
									} `json:"quota"`
								} `json:"properties"`
							} `json:"spec"`
						} `json:"properties"`
					} `json:"openAPIV3Schema"`
				} `json:"schema"`
			} `json:"versions"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &crd); err != nil {
		t.Fatal(err)
	}
	rules := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties.Quota.Properties.Memory.Rules
	if len(rules) != 1 {
		t.Fatalf("want one rule on quota.memory, got %+v", rules)
	}
	env, err := environment.MustBaseEnvSet(version.MajorMinor(1, 37)).NewExpressionsEnv().Extend(cel.Variable("self", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(rules[0].Rule)
	if iss.Err() != nil {
		t.Fatalf("compile %q: %v", rules[0].Rule, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		value any
		ok    bool
	}{{"80Gi", true}, {"0", true}, {int64(1024), true}, {"-1Gi", false}, {"-0.5", false}, {int64(-1), false}} {
		out, _, err := prg.Eval(map[string]any{"self": tc.value})
		if err != nil {
			t.Fatalf("%v: %v", tc.value, err)
		}
		if out.Value() != tc.ok {
			t.Errorf("memory %v: rule says %v, want %v", tc.value, out.Value(), tc.ok)
		}
	}
}

func TestIdleScaleDownNormalize(t *testing.T) {
	i := IdleScaleDown{After: metav1.Duration{Duration: time.Hour}}
	i.Normalize()
	if i.SMBelowPercent != DefaultSMBelowPercent {
		t.Errorf("smBelowPercent %d after Normalize; want %d", i.SMBelowPercent, DefaultSMBelowPercent)
	}
	i.SMBelowPercent = 7
	i.Normalize()
	if i.SMBelowPercent != 7 {
		t.Errorf("Normalize changed a set smBelowPercent to %d", i.SMBelowPercent)
	}
}
