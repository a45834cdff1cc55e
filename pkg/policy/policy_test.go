package policy

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func TestResolve(t *testing.T) {
	pol := func(name string, prio int32, ns, pod map[string]string, iso api.Isolation) *api.SharingPolicy {
		p := &api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: api.SharingPolicySpec{Priority: prio, Isolation: iso}}
		if ns != nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
		}
		if pod != nil {
			p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: pod}
		}
		return p
	}
	ps := []*api.SharingPolicy{
		pol("default", -1000, nil, nil, api.IsolationNamespace),
		pol("team", 0, map[string]string{"team": "ml"}, nil, api.IsolationNone),
		pol("critical", 10, nil, map[string]string{"tier": "critical"}, api.IsolationExclusive),
		pol("b-tie", 0, map[string]string{"team": "ml"}, nil, api.IsolationExclusive),
	}
	for _, tc := range []struct {
		ns, pod map[string]string
		want    string
	}{
		{map[string]string{}, map[string]string{}, "default"},
		{map[string]string{"team": "ml"}, map[string]string{}, "b-tie"}, // equal priority: first name
		{map[string]string{"team": "ml"}, map[string]string{"tier": "critical"}, "critical"},
		{map[string]string{}, nil, "default"}, // no pod yet: pod selectors match nothing
	} {
		if got := Resolve(ps, tc.ns, tc.pod); got.Name != tc.want {
			t.Errorf("ns %v pod %v: got %q, want %q", tc.ns, tc.pod, got.Name, tc.want)
		}
	}
	if e := Resolve(nil, nil, nil); e.Isolation != api.IsolationNamespace || e.Name != "" {
		t.Errorf("built-in default %+v", e)
	}
	if e := FromSpec("x", &api.SharingPolicySpec{Isolation: api.IsolationNone}); !e.AllowSharedGPU {
		t.Error("isolation none must let other domains share the GPU")
	}
	if e := FromSpec("x", &api.SharingPolicySpec{Isolation: api.IsolationExclusive}); e.MaxTenants != 1 {
		t.Errorf("exclusive: maxTenants %d", e.MaxTenants)
	}
}
