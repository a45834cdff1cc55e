package controller

import (
	"testing"

	"github.com/fgpu-dev/fgpu/internal/testing/admission"
)

// The chart's fgpu-mps-daemon-pods-own-node pins what a daemon pod the plugin creates may
// carry, besides its label and node: else a plugin (one compromised node) could create, on its
// own node, a pod labelled mps-daemon that runs as the allocator's service account (same
// namespace), and so obtain its cluster-wide token, or mount the namespace's Secrets.
func TestMPSDaemonPolicyPinsWhatADaemonPodCarries(t *testing.T) {
	p := admission.Load(t, "mps-daemon-admission.yaml").Policies["fgpu-mps-daemon-pods-own-node"]
	if p == nil {
		t.Fatal("no fgpu-mps-daemon-pods-own-node in the chart")
	}
	const pluginUser = admission.PluginUser
	pod := map[string]any{
		"metadata": map[string]any{"name": "fgpu-mps-x", "namespace": "fgpu-system", "labels": map[string]any{"app.kubernetes.io/component": "mps-daemon"}},
		"spec": map[string]any{"nodeName": "n1", "serviceAccountName": "fgpu-allocator", "automountServiceAccountToken": true,
			"volumes":    []any{map[string]any{"name": "s", "secret": map[string]any{"secretName": "sh.helm.release.v1.fgpu.v1"}}},
			"containers": []any{map[string]any{"name": "c", "image": "x"}}},
	}
	request := map[string]any{"operation": "CREATE", "userInfo": map[string]any{"username": pluginUser,
		"extra": map[string]any{"authentication.kubernetes.io/node-name": []any{"n1"}}}}
	refused := func(pod map[string]any) bool {
		if !admission.Matches(t, p, request, pod, nil) {
			t.Fatal("the policy does not apply to the plugin")
		}
		return admission.Validate(t, p, request, pod, nil) != ""
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
	if msg := admission.Validate(t, p, request, nil, old); msg != "" {
		t.Errorf("the deletion of an earlier daemon pod is refused: %s", msg)
	}
}
