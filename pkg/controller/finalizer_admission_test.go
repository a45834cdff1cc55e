package controller

import (
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	"github.com/fgpu-dev/fgpu/internal/testing/admission"
)

// TestFinalizerPolicyRenders checks what the API server needs beyond the CEL: the binding
// names the policy and denies, and the policy fails closed on UPDATE of claims only.
func TestFinalizerPolicyRenders(t *testing.T) {
	p, b := admission.Only(t, "claim-finalizer-admission.yaml")
	if b.Spec.PolicyName != p.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionv1.Deny {
		t.Errorf("binding %+v does not deny with policy %s", b.Spec, p.Name)
	}
	if p.Spec.FailurePolicy == nil || *p.Spec.FailurePolicy != admissionv1.Fail {
		t.Error("the policy does not fail closed")
	}
	rules := p.Spec.MatchConstraints.ResourceRules
	if len(rules) != 1 || strings.Join(rules[0].Resources, ",") != "resourceclaims" || len(rules[0].Operations) != 1 || rules[0].Operations[0] != admissionv1.Update {
		t.Errorf("match rules %+v: want UPDATE of resourceclaims (not their status) only", rules)
	}
}

// TestFinalizerPolicyCompiles compiles every expression as the API server does.
func TestFinalizerPolicyCompiles(t *testing.T) {
	p, _ := admission.Only(t, "claim-finalizer-admission.yaml")
	admission.Compile(t, p)
}

// admitUpdate runs the policy on an UPDATE of a claim by user; it returns the refusal
// message or "".
func admitUpdate(t *testing.T, p *admissionv1.ValidatingAdmissionPolicy, user string, old, cur map[string]any) string {
	request := map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
		"operation": "UPDATE", "namespace": "a", "userInfo": map[string]any{"username": user}}
	return admission.Review(t, p, request, cur, old)
}

// A tenant may not remove the finalizers that keep an allocated fgpu claim until its shares
// are released; the components that release them may, and anything else stays allowed.
func TestFinalizerPolicy(t *testing.T) {
	p, _ := admission.Only(t, "claim-finalizer-admission.yaml")
	both := []any{"fgpu.dev/allocator", "resource.kubernetes.io/delete-protection"}
	fgpuAlloc := map[string]any{"devices": map[string]any{"results": []any{map[string]any{"driver": "gpu.fgpu.dev", "pool": "n1", "device": "gpu-0", "request": "gpu"}}}}
	otherAlloc := map[string]any{"devices": map[string]any{"results": []any{map[string]any{"driver": "example.com", "pool": "n1", "device": "d", "request": "r"}}}}
	claim := func(fin []any, alloc map[string]any, deleting bool) map[string]any {
		meta := map[string]any{"name": "c", "namespace": "a"}
		if fin != nil {
			meta["finalizers"] = fin
		}
		if deleting {
			meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
		}
		c := map[string]any{"metadata": meta, "spec": map[string]any{}}
		if alloc != nil {
			c["status"] = map[string]any{"allocation": alloc}
		}
		return c
	}
	const tenant = "system:serviceaccount:a:attacker"
	for _, tc := range []struct {
		name     string
		user     string
		old, cur map[string]any
		refused  string // the finalizers named in the refusal; "" for allowed
	}{
		{"tenant strips both", tenant, claim(both, fgpuAlloc, false), claim(nil, fgpuAlloc, false), "fgpu.dev/allocator, resource.kubernetes.io/delete-protection"},
		{"tenant strips the allocator's", tenant, claim(both, fgpuAlloc, false), claim(both[1:], fgpuAlloc, false), "fgpu.dev/allocator"},
		{"tenant strips delete-protection", tenant, claim(both, fgpuAlloc, false), claim(both[:1], fgpuAlloc, false), "resource.kubernetes.io/delete-protection"},
		{"tenant strips them from a deleted claim", tenant, claim(both, fgpuAlloc, true), claim(nil, fgpuAlloc, true), "fgpu.dev/allocator, resource.kubernetes.io/delete-protection"},
		{"tenant adds its own finalizer", tenant, claim(both, fgpuAlloc, false), claim(append([]any{"example.com/mine"}, both...), fgpuAlloc, false), ""},
		{"tenant removes its own finalizer", tenant, claim(append([]any{"example.com/mine"}, both...), fgpuAlloc, false), claim(both, fgpuAlloc, false), ""},
		{"tenant strips an unallocated claim", tenant, claim(both, nil, false), claim(nil, nil, false), ""},
		{"tenant strips another driver's claim", tenant, claim(both, otherAlloc, false), claim(nil, otherAlloc, false), ""},
		{"allocator drops its finalizer", "system:serviceaccount:fgpu-system:fgpu-allocator", claim(both, fgpuAlloc, true), claim(both[1:], fgpuAlloc, true), ""},
		{"claim controller drops delete-protection", "system:serviceaccount:kube-system:resource-claim-controller", claim(both[1:], fgpuAlloc, true), claim(nil, fgpuAlloc, true), ""},
		{"controller manager without its own accounts", "system:kube-controller-manager", claim(both[1:], fgpuAlloc, true), claim(nil, fgpuAlloc, true), ""},
		{"the allocator of another release", "system:serviceaccount:other:fgpu-allocator", claim(both, fgpuAlloc, false), claim(nil, fgpuAlloc, false), "fgpu.dev/allocator, resource.kubernetes.io/delete-protection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msg := admitUpdate(t, p, tc.user, tc.old, tc.cur)
			if tc.refused == "" {
				if msg != "" {
					t.Fatalf("refused: %q", msg)
				}
				return
			}
			if !strings.Contains(msg, "ResourceClaim a/c holds an allocation of fgpu GPU shares") ||
				!strings.Contains(msg, "(refused: "+tc.refused+")") || !strings.Contains(msg, "delete the pods that use the claim") {
				t.Fatalf("message %q", msg)
			}
		})
	}
}
