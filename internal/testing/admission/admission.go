// Package admission loads the chart's ValidatingAdmissionPolicies and runs them as the API
// server would, for the unit tests of what each one admits and refuses.
package admission

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/version"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// The service accounts the chart renders for release namespace fgpu-system.
const (
	AllocatorUser = "system:serviceaccount:fgpu-system:fgpu-allocator"
	PluginUser    = "system:serviceaccount:fgpu-system:fgpu-kubelet-plugin"
)

// rendered are the template directives the policies use, as the chart renders them for
// release namespace fgpu-system, driver gpu.fgpu.dev and its default fence taint. Lines with
// any other directive (labels, conditions) are dropped.
var rendered = strings.NewReplacer(
	"{{ .Release.Namespace }}", "fgpu-system",
	"{{ .Values.driverName | squote }}", "'gpu.fgpu.dev'",
	"{{ .Values.allocator.fenceTaintKey | squote }}", "'fgpu.dev/allocator'",
	`{{ include "fgpu.pluginServiceAccount" . | quote }}`, `"`+PluginUser+`"`,
)

// Chart is one template of the chart, rendered: its policies and bindings by name.
type Chart struct {
	Policies map[string]*admissionv1.ValidatingAdmissionPolicy
	Bindings map[string]*admissionv1.ValidatingAdmissionPolicyBinding
}

// Load renders the chart's template (a file name under deployments/helm/fgpu/templates).
func Load(t testing.TB, template string) Chart {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(here), "../../../deployments/helm/fgpu/templates", template))
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(rendered.Replace(string(raw)), "\n") {
		if !strings.Contains(l, "{{") {
			lines = append(lines, l)
		}
	}
	c := Chart{Policies: map[string]*admissionv1.ValidatingAdmissionPolicy{}, Bindings: map[string]*admissionv1.ValidatingAdmissionPolicyBinding{}}
	for _, doc := range strings.Split(strings.Join(lines, "\n"), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("%s: %v", template, err)
		}
		switch meta.Kind {
		case "ValidatingAdmissionPolicy":
			var p admissionv1.ValidatingAdmissionPolicy
			if err := yaml.UnmarshalStrict([]byte(doc), &p); err != nil {
				t.Fatalf("%s: %v", template, err)
			}
			c.Policies[p.Name] = &p
		case "ValidatingAdmissionPolicyBinding":
			var b admissionv1.ValidatingAdmissionPolicyBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatalf("%s: %v", template, err)
			}
			c.Bindings[b.Name] = &b
		}
	}
	return c
}

// Only is the template's one policy and its binding, which must deny and fail closed.
func Only(t testing.TB, template string) (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	c := Load(t, template)
	if len(c.Policies) != 1 || len(c.Bindings) != 1 {
		t.Fatalf("%s: %d policies and %d bindings, want one of each", template, len(c.Policies), len(c.Bindings))
	}
	var p *admissionv1.ValidatingAdmissionPolicy
	var b *admissionv1.ValidatingAdmissionPolicyBinding
	for _, x := range c.Policies {
		p = x
	}
	for _, x := range c.Bindings {
		b = x
	}
	if b.Spec.PolicyName != p.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionv1.Deny {
		t.Errorf("%s: binding %+v does not deny with policy %s", template, b.Spec, p.Name)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
		t.Errorf("%s: the policy does not fail closed", template)
	}
	return p, b
}

// Review runs policy p on one request as the API server would (oldObject nil on CREATE,
// object nil on DELETE) and returns its refusal message, or "" where it admits the request
// or its match conditions leave it out.
func Review(t testing.TB, p *admissionv1.ValidatingAdmissionPolicy, request, object, oldObject map[string]any) string {
	t.Helper()
	if !Matches(t, p, request, object, oldObject) {
		return ""
	}
	return Validate(t, p, request, object, oldObject)
}

// Matches says whether p's match conditions take the request.
func Matches(t testing.TB, p *admissionv1.ValidatingAdmissionPolicy, request, object, oldObject map[string]any) bool {
	t.Helper()
	vars := variables(request, object, oldObject)
	for _, mc := range p.Spec.MatchConditions {
		if Eval(t, mc.Expression, vars) != true {
			return false
		}
	}
	return true
}

// Validate runs p's validations on the request, whatever its match conditions say, and
// returns the first refusal's message or "".
func Validate(t testing.TB, p *admissionv1.ValidatingAdmissionPolicy, request, object, oldObject map[string]any) string {
	t.Helper()
	vars := variables(request, object, oldObject)
	v := map[string]any{}
	for _, variable := range p.Spec.Variables {
		vars["variables"] = v
		v[variable.Name] = Eval(t, variable.Expression, vars)
	}
	vars["variables"] = v
	for _, val := range p.Spec.Validations {
		if Eval(t, val.Expression, vars) != true {
			if val.MessageExpression == "" {
				if val.Message != "" {
					return val.Message
				}
				return "failed expression: " + val.Expression // as the API server says it
			}
			msg, ok := Eval(t, val.MessageExpression, vars).(string)
			if !ok {
				t.Fatalf("messageExpression %q is not a string", val.MessageExpression)
			}
			return msg
		}
	}
	return ""
}

func variables(request, object, oldObject map[string]any) map[string]any {
	vars := map[string]any{"object": object, "oldObject": oldObject, "request": request, "variables": map[string]any{}}
	// A nil map is not CEL's null.
	if object == nil {
		vars["object"] = nil
	}
	if oldObject == nil {
		vars["oldObject"] = nil
	}
	return vars
}

// Eval evaluates one expression in Kubernetes' CEL environment, its inputs untyped.
func Eval(t testing.TB, expr string, vars map[string]any) any {
	t.Helper()
	env, err := environment.MustBaseEnvSet(version.MajorMinor(1, 37)).NewExpressionsEnv().Extend(
		cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType), cel.Variable("request", cel.DynType), cel.Variable("variables", cel.DynType))
	if err != nil {
		t.Fatal(err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		t.Fatalf("compile %q: %v", expr, iss.Err())
	}
	prg, err := env.Program(ast)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := prg.Eval(vars)
	if err != nil {
		t.Fatalf("eval %q: %v", expr, err)
	}
	return out.Value()
}

// Compile compiles every expression of p as the API server does, its request typed (an
// untyped one would accept request.resource == 'x', which the API server refuses).
func Compile(t testing.TB, p *admissionv1.ValidatingAdmissionPolicy) {
	t.Helper()
	cc, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(version.MajorMinor(1, 37)))
	if err != nil {
		t.Fatal(err)
	}
	opts := plugincel.OptionalVariableDeclarations{}
	for _, v := range p.Spec.Variables {
		if r := cc.CompileAndStoreVariable(expression{name: v.Name, text: v.Expression, types: []*cel.Type{cel.AnyType}}, opts, environment.StoredExpressions); r.Error != nil {
			t.Errorf("variable %s: %v", v.Name, r.Error)
		}
	}
	check := func(what, e string, typ *cel.Type) {
		if r := cc.CompileCELExpression(expression{text: e, types: []*cel.Type{typ}}, opts, environment.StoredExpressions); r.Error != nil {
			t.Errorf("%s: %v", what, r.Error)
		}
	}
	for _, mc := range p.Spec.MatchConditions {
		check("matchCondition "+mc.Name, mc.Expression, cel.BoolType)
	}
	for _, v := range p.Spec.Validations {
		check("validation", v.Expression, cel.BoolType)
		if v.MessageExpression != "" {
			check("messageExpression", v.MessageExpression, cel.StringType)
		}
	}
}

type expression struct {
	name, text string
	types      []*cel.Type
}

func (e expression) GetExpression() string    { return e.text }
func (e expression) ReturnTypes() []*cel.Type { return e.types }
func (e expression) GetName() string          { return e.name }
