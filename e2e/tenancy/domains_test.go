package tenancy

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// attackDomains runs a victim's pod in victimNS, then the tenant's pods in its own namespace,
// one naming no isolation domain and one each naming the victim's domain, its namespace's
// old domain "ns-<victim>" and "default". None may reach the victim's MPS server: the
// victim's own domain name is refused, the others land in a domain of the tenant's
// namespace, with a pipe directory of its own.
func attackDomains(t *testing.T, victimNS string, tenant *framework.Tenant) {
	t.Helper()
	ctx := context.Background()
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "victim").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	running(t, victimNS, "victim")
	victim := probe(t, victimNS, "victim")
	vDomain, vPipe := victim.Env["FGPU_ISOLATION_DOMAIN"], victim.Env["CUDA_MPS_PIPE_DIRECTORY"]
	if vPipe == "" {
		t.Fatalf("the victim's pod got no MPS pipe directory: %v", victim.Env)
	}
	if !inNamespace(vDomain, victimNS) {
		t.Errorf("the victim's domain %q is not of its namespace %s", vDomain, victimNS)
	}

	attacks := map[string]string{"own": "", "victim-domain": vDomain, "victim-ns": "ns-" + victimNS, "default": "default"}
	for name, domain := range attacks {
		p := framework.MakeGPUPod(tenant.Namespace, name).Memory("10Gi")
		if domain != "" {
			p = p.Config(map[string]any{"isolationDomain": domain})
		}
		if _, err := p.CreateAs(ctx, tenant.Client); err != nil {
			t.Fatalf("tenant creates %s: %v", name, err)
		}
	}
	// The victim's readable domain "<ns>/<sub>" is not a sub-domain a claim can name: it is
	// refused, saying why (by the allocator, or by the plugin at prepare in scheduler mode).
	if _, err := cluster.WaitEvent(ctx, tenant.Namespace, "victim-domain", "must be a DNS label", time.Minute); err != nil {
		t.Errorf("a claim naming the victim's domain %q was not refused with a clear reason: %v", vDomain, err)
	}
	delete(attacks, "victim-domain")
	if err := cluster.Client.CoreV1().Pods(tenant.Namespace).Delete(ctx, "victim-domain", metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	for name, domain := range attacks {
		running(t, tenant.Namespace, name)
		got := probe(t, tenant.Namespace, name)
		gDomain, gPipe := got.Env["FGPU_ISOLATION_DOMAIN"], got.Env["CUDA_MPS_PIPE_DIRECTORY"]
		if gPipe == vPipe || gDomain == vDomain {
			t.Errorf("%s (isolationDomain %q) joined the victim's MPS server: domain %q, pipe %s", name, domain, gDomain, gPipe)
		}
		if !inNamespace(gDomain, tenant.Namespace) {
			t.Errorf("%s (isolationDomain %q) got domain %q, not one of its namespace %s", name, domain, gDomain, tenant.Namespace)
		}
	}
	// The node's own view: the victim's pipe directory is served by its own daemon, and no
	// tenant pod was handed it.
	st, err := framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Daemons[vPipe]) == 0 {
		t.Errorf("no MPS daemon serves the victim's pipe directory %s: %v", vPipe, st.Daemons)
	}
	healthy(t, victimNS, tenant.Namespace)
}
