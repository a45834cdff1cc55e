package controller

import (
	"os"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/yaml"
)

// The chart's fgpu-mps-daemon-pods-own-node pins what a daemon pod the plugin creates may
// carry, besides its label and node: else a plugin (one compromised node) could create, on its
// own node, a pod labelled mps-daemon that runs as the allocator's service account (same
// namespace), and so obtain its cluster-wide token, or mount the namespace's Secrets.
func TestMPSDaemonPolicyPinsWhatADaemonPodCarries(t *testing.T) {
	raw, err := os.ReadFile("../../deployments/helm/fgpu/templates/mps-daemon-admission.yaml")
	if err != nil {
		t.Fatal(err)
	}
	const pluginUser = "system:serviceaccount:fgpu-system:fgpu-kubelet-plugin"
	var lines []string
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.Contains(l, "include \"fgpu.pluginServiceAccount\"") {
			l = strings.Replace(l, `{{ include "fgpu.pluginServiceAccount" . | quote }}`, `"`+pluginUser+`"`, 1)
		}
		if strings.Contains(l, "{{") {
			continue
		}
		lines = append(lines, l)
	}
	var p admissionv1.ValidatingAdmissionPolicy
	if err := yaml.Unmarshal([]byte(strings.Split(strings.Join(lines, "\n"), "\n---\n")[0]), &p); err != nil {
		t.Fatal(err)
	}
	pod := map[string]any{
		"metadata": map[string]any{"name": "fgpu-mps-x", "namespace": "fgpu-system", "labels": map[string]any{"app.kubernetes.io/component": "mps-daemon"}},
		"spec": map[string]any{"nodeName": "n1", "serviceAccountName": "fgpu-allocator", "automountServiceAccountToken": true,
			"volumes":    []any{map[string]any{"name": "s", "secret": map[string]any{"secretName": "sh.helm.release.v1.fgpu.v1"}}},
			"containers": []any{map[string]any{"name": "c", "image": "x"}}},
	}
	request := map[string]any{"operation": "CREATE", "userInfo": map[string]any{"username": pluginUser,
		"extra": map[string]any{"authentication.kubernetes.io/node-name": []any{"n1"}}}}
	refused := func(pod map[string]any) bool {
		vars := map[string]any{"object": pod, "oldObject": nil, "request": request, "variables": map[string]any{}}
		for _, mc := range p.Spec.MatchConditions {
			if evalCEL(t, mc.Expression, vars) != true {
				t.Fatal("the policy does not apply to the plugin")
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
				return true
			}
		}
		return false
	}
	// The evaluation works: the same pod on another node is refused.
	other := map[string]any{"metadata": pod["metadata"], "spec": map[string]any{"nodeName": "n2", "containers": []any{}}}
	if !refused(other) {
		t.Fatal("a pod on another node was admitted: the evaluation is broken")
	}
	if !refused(pod) {
		t.Error("the plugin may create, on its own node, a daemon-labelled pod running as fgpu-allocator with a Secret mounted")
	}
	hostPath := map[string]any{"name": "daemon", "hostPath": map[string]any{"path": "/var/run/fgpu/mps/k"}}
	daemon := func(mutate func(spec map[string]any)) map[string]any {
		spec := map[string]any{"nodeName": "n1", "serviceAccountName": "fgpu-mps-daemon", "automountServiceAccountToken": false,
			"volumes":    []any{hostPath},
			"containers": []any{map[string]any{"name": "mps-control", "image": "x"}}}
		if mutate != nil {
			mutate(spec)
		}
		return map[string]any{"metadata": pod["metadata"], "spec": spec}
	}
	if refused(daemon(nil)) {
		t.Error("the pod the plugin creates (its service account, no token, host directories) was refused")
	}
	for what, mutate := range map[string]func(map[string]any){
		"the default service account": func(s map[string]any) { delete(s, "serviceAccountName") },
		"a token mounted":             func(s map[string]any) { s["automountServiceAccountToken"] = true },
		"the token mount left unset":  func(s map[string]any) { delete(s, "automountServiceAccountToken") },
		"a ConfigMap volume": func(s map[string]any) {
			s["volumes"] = []any{hostPath, map[string]any{"name": "c", "configMap": map[string]any{"name": "x"}}}
		},
		"a projected volume": func(s map[string]any) {
			s["volumes"] = []any{hostPath, map[string]any{"name": "p", "projected": map[string]any{"sources": []any{}}}}
		},
	} {
		if !refused(daemon(mutate)) {
			t.Errorf("a daemon pod with %s was admitted", what)
		}
	}
	// A daemon pod created by an earlier version (default service account) may still be deleted.
	request["operation"] = "DELETE"
	old := daemon(func(s map[string]any) { delete(s, "serviceAccountName") })
	vars := map[string]any{"object": nil, "oldObject": old, "request": request, "variables": map[string]any{}}
	v := map[string]any{}
	for _, variable := range p.Spec.Variables {
		vars["variables"] = v
		v[variable.Name] = evalCEL(t, variable.Expression, vars)
	}
	for _, val := range p.Spec.Validations {
		if evalCEL(t, val.Expression, vars) != true {
			t.Errorf("the deletion of an earlier daemon pod is refused by %q", val.Expression)
		}
	}
}
