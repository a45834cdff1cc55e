package controller

import (
	"slices"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"

	"github.com/fgpu-dev/fgpu/internal/testing/admission"
)

func matches(rules []admissionv1.NamedRuleWithOperations, groups, resources []string, ops ...admissionv1.OperationType) bool {
	return len(rules) == 1 && slices.Equal(rules[0].APIGroups, groups) && slices.Equal(rules[0].Resources, resources) &&
		slices.Equal(rules[0].Operations, ops) && slices.Equal(rules[0].APIVersions, []string{"*"})
}

const (
	allocatorUser = admission.AllocatorUser
	pluginUser    = admission.PluginUser
	tenantUser    = "system:serviceaccount:a:attacker"
)

// `kubectl fgpu why` shows a claim's fgpu.dev/status as the allocator's word: only the
// allocator may set, change or remove it, on a claim or through a template; a tenant's own
// annotations, fgpu.dev/ ones included, stay its own.
func TestClaimStatusPolicy(t *testing.T) {
	p, _ := admission.Only(t, "claim-status-admission.yaml")
	admission.Compile(t, p)
	if !matches(p.Spec.MatchConstraints.ResourceRules, []string{"resource.k8s.io"}, []string{"resourceclaims", "resourceclaimtemplates"}, admissionv1.Create, admissionv1.Update) {
		t.Errorf("match rules %+v: want CREATE and UPDATE of claims and templates", p.Spec.MatchConstraints.ResourceRules)
	}
	claim := func(annotations map[string]any) map[string]any {
		meta := map[string]any{"name": "c", "namespace": "a", "labels": map[string]any{"app": "x"}}
		if annotations != nil {
			meta["annotations"] = annotations
		}
		return map[string]any{"metadata": meta, "spec": map[string]any{}}
	}
	template := func(annotations map[string]any) map[string]any {
		inner := map[string]any{"spec": map[string]any{}}
		if annotations != nil {
			inner["metadata"] = map[string]any{"annotations": annotations}
		}
		return map[string]any{"metadata": map[string]any{"name": "c", "namespace": "a"}, "spec": inner}
	}
	status := func(msg string) map[string]any { return map[string]any{"fgpu.dev/status": msg} }
	const said = "over the GPU memory quota of namespace a"
	relabelled := claim(status(said))
	relabelled["metadata"] = map[string]any{"name": "c", "namespace": "a", "labels": map[string]any{"app": "y"}, "annotations": status(said)}
	for _, tc := range []struct {
		name, resource, operation, user string
		old, cur                        map[string]any
		refused                         bool
	}{
		{"tenant overwrites the allocator's status", "resourceclaims", "UPDATE", tenantUser, claim(status(said)), claim(status("placed: all is well")), true},
		{"tenant adds a status", "resourceclaims", "UPDATE", tenantUser, claim(nil), claim(status("placed")), true},
		{"tenant removes the status", "resourceclaims", "UPDATE", tenantUser, claim(status(said)), claim(map[string]any{}), true},
		{"tenant creates a claim with a status", "resourceclaims", "CREATE", tenantUser, nil, claim(status("placed")), true},
		{"tenant creates a template with a status", "resourceclaimtemplates", "CREATE", tenantUser, nil, template(status("placed")), true},
		{"tenant adds a status to its template", "resourceclaimtemplates", "UPDATE", tenantUser, template(nil), template(status("placed")), true},
		{"claim from a template that carried a status", "resourceclaims", "CREATE", "system:serviceaccount:kube-system:resource-claim-controller", nil, claim(status("placed")), true},
		{"allocator of another release", "resourceclaims", "UPDATE", "system:serviceaccount:other:fgpu-allocator", claim(nil), claim(status("placed")), true},
		{"tenant relabels, the status untouched", "resourceclaims", "UPDATE", tenantUser, claim(status(said)), relabelled, false},
		{"tenant writes another annotation", "resourceclaims", "UPDATE", tenantUser, claim(nil), claim(map[string]any{"fgpu.dev/tenancy": "{}", "example.com/x": "y"}), false},
		{"tenant creates a plain claim", "resourceclaims", "CREATE", tenantUser, nil, claim(nil), false},
		{"tenant creates a plain template", "resourceclaimtemplates", "CREATE", tenantUser, nil, template(map[string]any{"example.com/x": "y"}), false},
		{"allocator tells the status", "resourceclaims", "UPDATE", allocatorUser, claim(status(said)), claim(status("placed on n1/gpu-0")), false},
		{"tenant removes the allocator's reclaim mark", "resourceclaims", "UPDATE", tenantUser, claim(map[string]any{"fgpu.dev/reclaimed": "n1/gpu-0"}), claim(map[string]any{}), true},
		{"tenant creates a template with a reclaim mark", "resourceclaimtemplates", "CREATE", tenantUser, nil, template(map[string]any{"fgpu.dev/reclaimed": "n1/gpu-0"}), true},
		{"allocator marks a claim it takes back", "resourceclaims", "UPDATE", allocatorUser, claim(nil), claim(map[string]any{"fgpu.dev/reclaimed": "n1/gpu-0"}), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			request := map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "version": "v1", "resource": tc.resource},
				"operation": tc.operation, "namespace": "a", "userInfo": map[string]any{"username": tc.user}}
			msg := admission.Review(t, p, request, tc.cur, tc.old)
			if (msg != "") != tc.refused {
				t.Fatalf("refused=%v (%q), want refused=%v", msg != "", msg, tc.refused)
			}
			if tc.refused && (!strings.Contains(msg, "a/c: the annotation fgpu.dev/") || !strings.Contains(msg, "only the allocator may set, change or remove it")) {
				t.Errorf("message %q", msg)
			}
		})
	}
}

// `kubectl fgpu recommendations` trusts the allocator's events and `kubectl fgpu why` lists
// events by source: no one but fgpu's own service accounts may write an event, of either
// events API, in the name of fgpu's components.
func TestEventSourcePolicy(t *testing.T) {
	p, _ := admission.Only(t, "event-admission.yaml")
	admission.Compile(t, p)
	if !matches(p.Spec.MatchConstraints.ResourceRules, []string{"", "events.k8s.io"}, []string{"events"}, admissionv1.Create, admissionv1.Update) {
		t.Errorf("match rules %+v: want CREATE and UPDATE of events of both APIs", p.Spec.MatchConstraints.ResourceRules)
	}
	core := func(source, reporting string) map[string]any {
		ev := map[string]any{"metadata": map[string]any{"name": "e", "namespace": "a"}, "reason": "FgpuSizingRecommendation", "message": "claim c: placed"}
		if source != "" {
			ev["source"] = map[string]any{"component": source}
		}
		if reporting != "" {
			ev["reportingComponent"] = reporting
		}
		return ev
	}
	eventsV1 := func(deprecatedSource, reporting string) map[string]any {
		ev := map[string]any{"metadata": map[string]any{"name": "e", "namespace": "a"}, "reason": "FgpuSizingRecommendation", "note": "claim c: placed"}
		if deprecatedSource != "" {
			ev["deprecatedSource"] = map[string]any{"component": deprecatedSource}
		}
		if reporting != "" {
			ev["reportingController"] = reporting
		}
		return ev
	}
	for _, tc := range []struct {
		name, group, user string
		event             map[string]any
		refused           string // the component named in the refusal; "" for allowed
	}{
		{"tenant as the allocator", "", tenantUser, core("fgpu-allocator", ""), "fgpu-allocator"},
		{"tenant reporting as the allocator", "", tenantUser, core("mine", "fgpu-allocator"), "fgpu-allocator"},
		{"tenant as the plugin", "", tenantUser, core("fgpu-kubelet-plugin", ""), "fgpu-kubelet-plugin"},
		{"tenant as the allocator, events.k8s.io", "events.k8s.io", tenantUser, eventsV1("", "fgpu-allocator"), "fgpu-allocator"},
		{"tenant as the plugin, events.k8s.io deprecatedSource", "events.k8s.io", tenantUser, eventsV1("fgpu-kubelet-plugin", "mine"), "fgpu-kubelet-plugin"},
		{"the plugin as the allocator", "", pluginUser, core("fgpu-allocator", "fgpu-allocator"), "fgpu-allocator"},
		{"allocator of another release", "", "system:serviceaccount:other:fgpu-allocator", core("fgpu-allocator", "fgpu-allocator"), "fgpu-allocator"},
		{"tenant in its own name", "", tenantUser, core("mine", "mine"), ""},
		{"tenant without a source", "", tenantUser, core("", ""), ""},
		{"tenant in its own name, events.k8s.io", "events.k8s.io", tenantUser, eventsV1("", "mine"), ""},
		{"the kubelet", "", "system:node:n1", core("kubelet", "kubelet"), ""},
		{"the allocator", "", allocatorUser, core("fgpu-allocator", "fgpu-allocator"), ""},
		{"the plugin", "", pluginUser, core("fgpu-kubelet-plugin", ""), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, op := range []string{"CREATE", "UPDATE"} {
				request := map[string]any{"resource": map[string]any{"group": tc.group, "version": "v1", "resource": "events"},
					"operation": op, "namespace": "a", "userInfo": map[string]any{"username": tc.user}}
				old := map[string]any(nil)
				if op == "UPDATE" {
					old = core("", "")
				}
				msg := admission.Review(t, p, request, tc.event, old)
				if tc.refused == "" {
					if msg != "" {
						t.Fatalf("%s refused: %q", op, msg)
					}
					continue
				}
				if !strings.Contains(msg, "only fgpu may write events in the name of "+tc.refused+" ") || !strings.Contains(msg, "event a/e") {
					t.Fatalf("%s: message %q", op, msg)
				}
			}
		})
	}
}

// A claim whose GPU the allocator takes back (fgpu.dev/reclaimed) keeps the pods that
// reserved it until they are gone, and gets no new one: a controller's new pods must not keep
// it allocated on that GPU for ever. Releasing (kube-controller-manager) and unmarked claims
// are untouched.
func TestReclaimedClaimGetsNoNewPods(t *testing.T) {
	p, _ := admission.Only(t, "claim-reclaim-admission.yaml")
	admission.Compile(t, p)
	if !matches(p.Spec.MatchConstraints.ResourceRules, []string{"resource.k8s.io"}, []string{"resourceclaims/status"}, admissionv1.Update) {
		t.Errorf("match rules %+v: want UPDATE of claims' status", p.Spec.MatchConstraints.ResourceRules)
	}
	claim := func(marked bool, pods ...string) map[string]any {
		meta := map[string]any{"name": "c", "namespace": "a"}
		if marked {
			meta["annotations"] = map[string]any{"fgpu.dev/reclaimed": "n1/gpu-0"}
		}
		var reserved []any
		for _, p := range pods {
			reserved = append(reserved, map[string]any{"resource": "pods", "name": p, "uid": "uid-" + p})
		}
		status := map[string]any{"allocation": map[string]any{}}
		if reserved != nil {
			status["reservedFor"] = reserved
		}
		return map[string]any{"metadata": meta, "spec": map[string]any{}, "status": status}
	}
	const scheduler = "system:kube-scheduler"
	for _, tc := range []struct {
		name     string
		old, cur map[string]any
		refused  bool
	}{
		{"new pod of a marked claim", claim(true, "old"), claim(true, "old", "new"), true},
		{"first pod of a marked claim", claim(true), claim(true, "new"), true},
		{"a pod replaced by another", claim(true, "old"), claim(true, "new"), true},
		{"old pod gone", claim(true, "old", "older"), claim(true, "old"), false},
		{"deallocated", claim(true), func() map[string]any { c := claim(true); delete(c, "status"); return c }(), false},
		{"new pod of an unmarked claim", claim(false, "old"), claim(false, "old", "new"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			request := map[string]any{"resource": map[string]any{"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
				"subResource": "status", "operation": "UPDATE", "namespace": "a", "userInfo": map[string]any{"username": scheduler}}
			msg := admission.Review(t, p, request, tc.cur, tc.old)
			if (msg != "") != tc.refused {
				t.Fatalf("refused=%v (%q), want refused=%v", msg != "", msg, tc.refused)
			}
			if tc.refused && (!strings.Contains(msg, "a/c is being taken back from GPU n1/gpu-0") || !strings.Contains(msg, "refused: new")) {
				t.Errorf("message %q", msg)
			}
		})
	}
}
