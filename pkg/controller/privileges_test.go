package controller

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// namespaceObj is a Namespace with its name label, as the API server sets it, and labels
// given as key, value pairs: what namespaceSelectors see.
func namespaceObj(name string, kv ...string) *corev1.Namespace {
	labels := map[string]string{"kubernetes.io/metadata.name": name}
	for i := 0; i+1 < len(kv); i += 2 {
		labels[kv[i]] = kv[i+1]
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

// Finding 3 of issue #24: a tenant labelled its pods into the demo's critical-serving policy,
// which selected pods by label alone, and kept GPUs from the real critical team. A policy
// that grants privileges applies only where its namespaceSelector binds it: the team whose
// namespace the admin labelled gets the critical class; the tenant's pod with the same label
// gets its namespace's own rules; a policy that pod labels alone select says on its status
// that it applies to no pod.
func TestPodLabelsChooseNoPrivileges(t *testing.T) {
	critical := func(name string) *builders.PolicyBuilder {
		return builders.MakePolicy(name).Priority(100).Latency(api.LatencyCritical).MaxCo(0).Pods("fgpu.dev/latency", "critical")
	}
	pols := []*api.SharingPolicy{critical("labels-only").Obj(), critical("serving").Namespaces("tier", "serving").Obj()}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"),
		namespaceObj("team", "tier", "serving"), namespaceObj("tenant"),
		builders.MakeClaim("team", "c").Memory("10Gi").Obj(), builders.MakePod("team", "p").Claim("c").Label("fgpu.dev/latency", "critical").Obj(),
		builders.MakeClaim("tenant", "c").Memory("10Gi").Created(1).Obj(), builders.MakePod("tenant", "p").Claim("c").Label("fgpu.dev/latency", "critical").Obj())
	e.run()
	for ns, want := range map[string]struct {
		policy  string
		latency api.LatencyClass
	}{"team": {"serving", api.LatencyCritical}, "tenant": {"", api.LatencyStandard}} {
		cfg := allocCfg(t, e.claim(ns, "c"))
		if cfg.Placement == nil || cfg.Placement.Policy != want.policy || cfg.Placement.LatencyClass != want.latency {
			t.Errorf("%s: placed under %+v, want policy %q, latency %s", ns, cfg.Placement, want.policy, want.latency)
		}
	}
	e.syncPolicies()
	p, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Get(e.ctx, "labels-only", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(p.Status.Conditions, api.ConditionAccepted)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != api.ReasonUnboundPrivileges || !strings.Contains(c.Message, "add a namespaceSelector") {
		t.Errorf("labels-only: Accepted %+v", c)
	}
	if ev := e.events("SharingPolicy labels-only applies to no pod: it grants latencyClass critical"); len(ev) != 1 {
		t.Errorf("want one event saying labels-only applies to no pod: %v", e.events(ReasonInvalidPolicy))
	}
}
