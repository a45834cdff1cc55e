package v1alpha1

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// crdValidator loads the chart's SharingPolicy CRD, checks it as the API server does when it
// is created (schema, CEL compilation and cost), and returns the spec's CEL validator.
func crdValidator(t *testing.T) (*schema.Structural, *cel.Validator) {
	t.Helper()
	raw, err := os.ReadFile("../../../deployments/helm/fgpu/crds/fgpu.dev_sharingpolicies.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v1 apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(raw, &v1); err != nil {
		t.Fatal(err)
	}
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(&v1)
	var crd apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1, &crd, nil); err != nil {
		t.Fatal(err)
	}
	if errs := validation.ValidateCustomResourceDefinition(context.Background(), &crd); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD: %v", errs.ToAggregate())
	}
	// The conversion moves a schema that every version shares to spec.validation.
	s, err := schema.NewStructural(crd.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	return s, cel.NewValidator(s, true, celconfig.PerCallLimit)
}

// The CRD's rules refuse a label selector's operators without or with values as Validate
// does, and nothing Validate accepts. Keys and values that are not label keys and values are
// left to Validate: rules that check them (format.qualifiedName, format.labelValue) exceed
// the CRD's cost budget, as metav1.LabelSelector's lists, maps and strings have no bounds.
func TestCRDRefusesInvalidSelectors(t *testing.T) {
	s, v := crdValidator(t)
	req := func(key string, op metav1.LabelSelectorOperator, values ...string) metav1.LabelSelectorRequirement {
		return metav1.LabelSelectorRequirement{Key: key, Operator: op, Values: values}
	}
	exprs := func(r ...metav1.LabelSelectorRequirement) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: r}
	}
	for name, tc := range map[string]struct {
		sel           *metav1.LabelSelector
		schemaRefuses bool // else only Validate may
	}{
		"empty":                  {&metav1.LabelSelector{}, false},
		"matchLabels":            {&metav1.LabelSelector{MatchLabels: map[string]string{"team": "ml", "example.com/tier": "a-1.b_2", "empty": ""}}, false},
		"In":                     {exprs(req("team", "In", "a", "b")), false},
		"NotIn":                  {exprs(req("example.com/team", "NotIn", "a")), false},
		"Exists":                 {exprs(req("team", "Exists")), false},
		"DoesNotExist":           {exprs(req("team", "DoesNotExist")), false},
		"In without values":      {exprs(req("team", "Exists"), req("team", "In")), true},
		"NotIn without values":   {exprs(req("team", "NotIn")), true},
		"Exists with values":     {exprs(req("team", "Exists", "a")), true},
		"DoesNotExist w/ values": {exprs(req("team", "DoesNotExist", "a")), true},
		"unknown operator":       {exprs(req("team", "Equals", "a")), true},
		"bad expression key":     {exprs(req("bad key!", "Exists")), false},
		"bad expression value":   {exprs(req("team", "In", "ok", "not ok")), false},
		"bad matchLabels key":    {&metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}, false},
	} {
		sel := tc.sel
		for _, fld := range []string{"namespaceSelector", "podSelector"} {
			t.Run(name+"/"+fld, func(t *testing.T) {
				spec := SharingPolicySpec{}
				if fld == "namespaceSelector" {
					spec.NamespaceSelector = sel
				} else {
					spec.PodSelector = sel
				}
				obj := toUnstructured(t, &SharingPolicy{TypeMeta: metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: SharingPolicyKind},
					ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: spec})
				errs, _ := v.Validate(context.Background(), field.NewPath(""), s, obj, nil, celconfig.RuntimeCELCostBudget)
				verr := spec.Validate()
				switch {
				case verr == nil && len(errs) > 0:
					t.Errorf("the schema refuses what Validate accepts: %v", errs.ToAggregate())
				case tc.schemaRefuses && len(errs) == 0:
					t.Errorf("the schema accepts what Validate refuses: %v", verr)
				case !tc.schemaRefuses && len(errs) > 0:
					t.Errorf("the schema refuses %v; update this table and the docs", errs.ToAggregate())
				case len(errs) > 0 && !strings.Contains(errs.ToAggregate().Error(), "spec."+fld):
					t.Errorf("the error does not name %s: %v", fld, errs.ToAggregate())
				}
				if !tc.schemaRefuses && name != "empty" && verr == nil && strings.Contains(name, "bad") {
					t.Errorf("Validate accepts %v", sel)
				}
			})
		}
	}
}

// The CRD's rule on idleScaleDown.after refuses what Validate refuses: under a minute.
func TestCRDIdleScaleDownAfter(t *testing.T) {
	s, v := crdValidator(t)
	for after, refused := range map[string]bool{"30s": true, "59s": true, "1m": false, "90s": false, "10m": false, "2h": false} {
		t.Run(after, func(t *testing.T) {
			d, err := time.ParseDuration(after)
			if err != nil {
				t.Fatal(err)
			}
			spec := SharingPolicySpec{IdleScaleDown: &IdleScaleDown{After: metav1.Duration{Duration: d}, SMBelowPercent: DefaultSMBelowPercent}}
			obj := toUnstructured(t, &SharingPolicy{TypeMeta: metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: SharingPolicyKind},
				ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: spec})
			errs, _ := v.Validate(context.Background(), field.NewPath(""), s, obj, nil, celconfig.RuntimeCELCostBudget)
			if got := len(errs) > 0; got != refused {
				t.Errorf("schema refuses %s: %v (%v); want %v", after, got, errs.ToAggregate(), refused)
			}
			if got := spec.Validate() != nil; got != refused {
				t.Errorf("Validate refuses %s: %v; want %v", after, got, refused)
			}
		})
	}
}

// The CRD refuses what UnboundPrivileges finds, and nothing else: a policy that grants a
// privilege to the pods its podSelector alone selects. An admin learns it at apply time; the
// allocator ignores such a policy stored before the rule (its Accepted condition says so).
func TestCRDRefusesUnboundPrivileges(t *testing.T) {
	s, v := crdValidator(t)
	pods := &metav1.LabelSelector{MatchLabels: map[string]string{"fgpu.dev/latency": "critical"}}
	byExpr := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpExists}}}
	team := &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "serving"}}
	two := int32(2)
	grants := map[string]SharingPolicySpec{
		"critical":       {LatencyClass: LatencyCritical},
		"maxTenants":     {MaxTenantsPerGPU: &two},
		"exclusive":      {Isolation: IsolationExclusive},
		"none":           {Isolation: IsolationNone},
		"allowSharedGPU": {AllowSharedGPU: true},
		"nothing":        {LatencyClass: LatencyBestEffort, Isolation: IsolationNamespace, Mode: PolicyModeTimeSlicing},
	}
	for name, g := range grants {
		for sel, tc := range map[string]struct{ ns, pod *metav1.LabelSelector }{
			"pod labels alone":          {nil, pods},
			"pod expressions alone":     {nil, byExpr},
			"empty namespace selector":  {&metav1.LabelSelector{}, pods},
			"bound to namespaces":       {team, pods},
			"bound by expression":       {byExpr, pods},
			"no selector":               {nil, nil},
			"empty pod selector":        {nil, &metav1.LabelSelector{}},
			"namespaces, no pod labels": {team, nil},
		} {
			t.Run(name+"/"+sel, func(t *testing.T) {
				spec := g
				spec.NamespaceSelector, spec.PodSelector = tc.ns, tc.pod
				obj := toUnstructured(t, &SharingPolicy{TypeMeta: metav1.TypeMeta{APIVersion: SchemeGroupVersion.String(), Kind: SharingPolicyKind},
					ObjectMeta: metav1.ObjectMeta{Name: "p"}, Spec: spec})
				errs, _ := v.Validate(context.Background(), field.NewPath(""), s, obj, nil, celconfig.RuntimeCELCostBudget)
				want := len(spec.UnboundPrivileges()) > 0
				if got := len(errs) > 0; got != want {
					t.Errorf("schema refuses: %v (%v); UnboundPrivileges %v", got, errs.ToAggregate(), spec.UnboundPrivileges())
				}
				if want && len(errs) > 0 && !strings.Contains(errs.ToAggregate().Error(), "add a namespaceSelector") {
					t.Errorf("refused without saying what to do: %v", errs.ToAggregate())
				}
			})
		}
	}
}

func toUnstructured(t *testing.T, p *SharingPolicy) map[string]any {
	t.Helper()
	raw, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	return m
}
