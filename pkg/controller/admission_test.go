package controller

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/util/version"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/cel/environment"
	"sigs.k8s.io/yaml"
)

// The chart's ValidatingAdmissionPolicy, its template directives stripped, evaluated with
// Kubernetes' CEL environment on claims and templates of each API version.
func loadClaimPolicy(t *testing.T) *admissionv1.ValidatingAdmissionPolicy {
	raw, err := os.ReadFile("../../deployments/helm/fgpu/templates/claim-admission.yaml")
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`\{\{ \.Values\.allocator\.fenceTaintKey \| squote \}\}`).ReplaceAllString(string(raw), "'fgpu.dev/allocator'")
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, "{{") {
			continue
		}
		lines = append(lines, l)
	}
	doc := strings.Split(strings.Join(lines, "\n"), "\n---\n")[0]
	var p admissionv1.ValidatingAdmissionPolicy
	if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
		t.Fatal(err)
	}
	return &p
}

func evalCEL(t *testing.T, expr string, vars map[string]any) any {
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

// admit runs the policy as the API server would and returns the refusal message or "".
func admit(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, resource, user string, object map[string]any) string {
	request := map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "version": "v1", "resource": resource},
		"namespace": "a", "userInfo": map[string]any{"username": user}}
	vars := map[string]any{"object": object, "request": request, "variables": map[string]any{}}
	for _, mc := range p.Spec.MatchConditions {
		if evalCEL(t, mc.Expression, vars) != true {
			return ""
		}
	}
	v := map[string]any{}
	for _, variable := range p.Spec.Variables {
		vars["variables"] = v
		v[variable.Name] = evalCEL(t, variable.Expression, vars)
	}
	vars["variables"] = v
	for _, val := range p.Spec.Validations {
		if evalCEL(t, val.Expression, vars) != true {
			msg, ok := evalCEL(t, val.MessageExpression, vars).(string)
			if !ok {
				t.Fatalf("messageExpression %q is not a string", val.MessageExpression)
			}
			return msg
		}
	}
	return ""
}

type expr struct {
	name, expression string
	types            []*cel.Type
}

func (e expr) GetExpression() string    { return e.expression }
func (e expr) ReturnTypes() []*cel.Type { return e.types }
func (e expr) GetName() string          { return e.name }

// TestClaimAdmissionPolicyCompiles compiles the policy as the API server does: request
// typed (a dyn model would accept request.resource == 'x', which the API server refuses).
func TestClaimAdmissionPolicyCompiles(t *testing.T) {
	compilePolicy(t, loadClaimPolicy(t))
}

// compilePolicy compiles every expression of an admission policy as the API server does,
// with its variables typed.
func compilePolicy(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy) {
	t.Helper()
	cc, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(version.MajorMinor(1, 37)))
	if err != nil {
		t.Fatal(err)
	}
	opts := plugincel.OptionalVariableDeclarations{}
	for _, v := range p.Spec.Variables {
		if r := cc.CompileAndStoreVariable(expr{name: v.Name, expression: v.Expression, types: []*cel.Type{cel.AnyType}}, opts, environment.StoredExpressions); r.Error != nil {
			t.Errorf("variable %s: %v", v.Name, r.Error)
		}
	}
	check := func(what, e string, typ *cel.Type) {
		if r := cc.CompileCELExpression(expr{expression: e, types: []*cel.Type{typ}}, opts, environment.StoredExpressions); r.Error != nil {
			t.Errorf("%s: %v", what, r.Error)
		}
	}
	for _, mc := range p.Spec.MatchConditions {
		check("matchCondition "+mc.Name, mc.Expression, cel.BoolType)
	}
	for _, v := range p.Spec.Validations {
		check("validation", v.Expression, cel.BoolType)
		check("messageExpression", v.MessageExpression, cel.StringType)
	}
}

func TestClaimAdmissionPolicy(t *testing.T) {
	p := loadClaimPolicy(t)
	fence := map[string]any{"key": "fgpu.dev/allocator", "operator": "Equal", "value": "required", "effect": "NoSchedule"}
	keyless := map[string]any{"operator": "Exists"}
	keylessNoExec := map[string]any{"operator": "Exists", "effect": "NoExecute"}
	other := map[string]any{"key": "example.com/x", "operator": "Exists"}
	claim := func(req map[string]any) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "c"}, "spec": map[string]any{"devices": map[string]any{"requests": []any{req}}}}
	}
	v1 := func(tol ...any) map[string]any {
		return claim(map[string]any{"name": "gpu", "exactly": map[string]any{"deviceClassName": "gpu.fgpu.dev", "tolerations": tol}})
	}
	v1beta1 := func(tol ...any) map[string]any {
		return claim(map[string]any{"name": "gpu", "deviceClassName": "gpu.fgpu.dev", "tolerations": tol})
	}
	firstAvailable := func(tol ...any) map[string]any {
		return claim(map[string]any{"name": "gpu", "firstAvailable": []any{map[string]any{"name": "a", "deviceClassName": "gpu.fgpu.dev"},
			map[string]any{"name": "b", "deviceClassName": "gpu.fgpu.dev", "tolerations": tol}}})
	}
	template := func(c map[string]any) map[string]any {
		return map[string]any{"metadata": map[string]any{"name": "t"}, "spec": map[string]any{"spec": c["spec"]}}
	}
	const user = "alice"
	for _, tc := range []struct {
		name, resource, user string
		obj                  map[string]any
		refused              bool
	}{
		{"clean v1 claim", "resourceclaims", user, v1(other), false},
		{"no requests", "resourceclaims", user, map[string]any{"metadata": map[string]any{"name": "c"}, "spec": map[string]any{}}, false},
		{"v1 fence", "resourceclaims", user, v1(fence), true},
		{"v1 keyless", "resourceclaims", user, v1(other, keyless), true},
		{"v1 keyless NoExecute only", "resourceclaims", user, v1(keylessNoExec), false},
		{"v1beta1 fence", "resourceclaims", user, v1beta1(fence), true},
		{"firstAvailable fence", "resourceclaims", user, firstAvailable(fence), true},
		{"template fence", "resourceclaimtemplates", user, template(v1(fence)), true},
		{"template firstAvailable keyless", "resourceclaimtemplates", user, template(firstAvailable(keyless)), true},
		{"clean template", "resourceclaimtemplates", user, template(v1()), false},
		{"claim from an admitted template", "resourceclaims", "system:serviceaccount:kube-system:resource-claim-controller", v1(fence), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := admit(t, p, tc.resource, tc.user, tc.obj)
			if (msg != "") != tc.refused {
				t.Fatalf("refused=%v (%q), want refused=%v", msg != "", msg, tc.refused)
			}
			if tc.refused && !strings.Contains(msg, "fgpu.dev/allocator") {
				t.Errorf("message %q does not name the taint", msg)
			}
		})
	}
}
