package controller

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	"github.com/fgpu-dev/fgpu/internal/testing/admission"
)

// TestClaimAdmissionPolicyCompiles compiles the policy as the API server does.
func TestClaimAdmissionPolicyCompiles(t *testing.T) {
	admission.Compile(t, loadClaimPolicy(t))
}

// loadClaimPolicy is the chart's fence-toleration policy.
func loadClaimPolicy(t *testing.T) *admissionv1.ValidatingAdmissionPolicy {
	p, _ := admission.Only(t, "claim-admission.yaml")
	return p
}

// admit runs the policy on a claim or template of resource, created by user.
func admit(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, resource, user string, object map[string]any) string {
	request := map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "version": "v1", "resource": resource},
		"namespace": "a", "userInfo": map[string]any{"username": user}}
	return admission.Review(t, p, request, object, nil)
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
