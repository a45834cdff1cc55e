package mps

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/google/cel-go/cel"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/yaml"

	"github.com/fgpu-dev/fgpu/internal/testing/fakekubelet"
)

// budgetPolicy is the chart's fgpu-mps-daemon-budgets-own-node.
func budgetPolicy(t *testing.T, pluginUser string) *admissionv1.ValidatingAdmissionPolicy {
	t.Helper()
	raw, err := os.ReadFile("../../deployments/helm/fgpu/templates/mps-daemon-admission.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		l = strings.Replace(l, `{{ include "fgpu.pluginServiceAccount" . | quote }}`, `"`+pluginUser+`"`, 1)
		if !strings.Contains(l, "{{") {
			lines = append(lines, l)
		}
	}
	for _, doc := range strings.Split(strings.Join(lines, "\n"), "\n---\n") {
		var p admissionv1.ValidatingAdmissionPolicy
		if err := yaml.Unmarshal([]byte(doc), &p); err != nil {
			t.Fatal(err)
		}
		if p.Kind == "ValidatingAdmissionPolicy" && p.Name == "fgpu-mps-daemon-budgets-own-node" {
			return &p
		}
	}
	t.Fatal("no fgpu-mps-daemon-budgets-own-node in the chart")
	return nil
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

// The plugin may create and delete the disruption budgets of its own node's daemons, and no
// other: else one node's plugin could hold the drain of another node, or of the namespace's
// other pods (the allocator's).
func TestBudgetPolicyAdmitsOnlyTheBudgetsOfItsNodesDaemons(t *testing.T) {
	const pluginUser = "system:serviceaccount:fgpu-system:fgpu-kubelet-plugin"
	p := budgetPolicy(t, pluginUser)
	ctx := context.Background()
	client := fake.NewClientset(fakekubelet.Node(testNode))
	l := &PodLauncher{Client: client, Namespace: testNS, NodeName: testNode}
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	if err := l.Protect(ctx, key, true); err != nil {
		t.Fatal(err)
	}
	made, err := client.PolicyV1().PodDisruptionBudgets(testNS).Get(ctx, l.PodName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	budget, err := runtime.DefaultUnstructuredConverter.ToUnstructured(made)
	if err != nil {
		t.Fatal(err)
	}
	refused := func(operation, onNode string, budget map[string]any) bool {
		t.Helper()
		request := map[string]any{"operation": operation, "userInfo": map[string]any{"username": pluginUser,
			"extra": map[string]any{"authentication.kubernetes.io/node-name": []any{onNode}}}}
		vars := map[string]any{"object": budget, "oldObject": nil, "request": request}
		if operation == "DELETE" {
			vars["object"], vars["oldObject"] = nil, budget
		}
		for _, mc := range p.Spec.MatchConditions {
			vars["variables"] = map[string]any{}
			if evalCEL(t, mc.Expression, vars) != true {
				t.Fatal("the policy does not apply to the plugin")
			}
		}
		v := map[string]any{}
		for _, variable := range p.Spec.Variables {
			vars["variables"] = v
			v[variable.Name] = evalCEL(t, variable.Expression, vars)
		}
		for _, val := range p.Spec.Validations {
			if evalCEL(t, val.Expression, vars) != true {
				return true
			}
		}
		return false
	}
	for _, op := range []string{"CREATE", "DELETE"} {
		if refused(op, testNode, budget) {
			t.Errorf("%s of the budget the plugin makes for its own daemon is refused: %v", op, budget)
		}
		if !refused(op, "node-b", budget) {
			t.Errorf("%s of node %s's daemon budget by node-b's plugin is admitted", op, testNode)
		}
	}
	object := func(m map[string]any, key string) map[string]any {
		o, ok := m[key].(map[string]any)
		if !ok {
			t.Fatalf("the budget has no object %q: %v", key, m)
		}
		return o
	}
	forged := func(mutate func(spec map[string]any)) map[string]any {
		b := runtime.DeepCopyJSON(budget)
		mutate(object(b, "spec"))
		return b
	}
	for name, b := range map[string]map[string]any{
		"the allocator's pods": forged(func(spec map[string]any) {
			spec["selector"] = map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/component": "allocator"}}
		}),
		"every daemon of the namespace": forged(func(spec map[string]any) {
			spec["selector"] = map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/component": "mps-daemon"}}
		}),
		"another node's daemons": forged(func(spec map[string]any) {
			object(object(spec, "selector"), "matchLabels")[NodeLabel] = "node-b"
		}),
		"a daemon and more": forged(func(spec map[string]any) {
			object(spec, "selector")["matchExpressions"] = []any{map[string]any{"key": "app", "operator": "Exists"}}
		}),
	} {
		if !refused("CREATE", testNode, b) {
			t.Errorf("a budget over %s is admitted: %v", name, b)
		}
	}
}
