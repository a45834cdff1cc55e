package mps

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/admission"
	"github.com/fgpu-dev/fgpu/internal/testing/fakekubelet"
)

// The plugin may create and delete the disruption budgets of its own node's daemons, and no
// other: else one node's plugin could hold the drain of another node, or of the namespace's
// other pods (the allocator's).
func TestBudgetPolicyAdmitsOnlyTheBudgetsOfItsNodesDaemons(t *testing.T) {
	const pluginUser = admission.PluginUser
	p := admission.Load(t, "mps-daemon-admission.yaml").Policies["fgpu-mps-daemon-budgets-own-node"]
	if p == nil {
		t.Fatal("no fgpu-mps-daemon-budgets-own-node in the chart")
	}
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
		object, oldObject := budget, map[string]any(nil)
		if operation == "DELETE" {
			object, oldObject = nil, budget
		}
		if !admission.Matches(t, p, request, object, oldObject) {
			t.Fatal("the policy does not apply to the plugin")
		}
		return admission.Validate(t, p, request, object, oldObject) != ""
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
			object(object(spec, "selector"), "matchLabels")[api.LabelMPSNode] = "node-b"
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
