package policy

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"k8s.io/utils/ptr"

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
		pol("critical", 10, map[string]string{"team": "ml"}, map[string]string{"tier": "critical"}, api.IsolationExclusive),
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

// Pod labels, which tenants write, choose a policy that grants privileges only where its
// namespaceSelector binds it to the pod's namespace (namespace labels are the admin's); a
// policy that takes nothing from other namespaces may be chosen by labels alone.
func TestResolvePodLabelsChooseNoPrivileges(t *testing.T) {
	critical := map[string]string{"fgpu.dev/latency": "critical"}
	serving := map[string]string{"tier": "serving"}
	pol := func(name string, prio int32, ns, pod map[string]string, spec api.SharingPolicySpec) *api.SharingPolicy {
		spec.Priority = prio
		if ns != nil {
			spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
		}
		if pod != nil {
			spec.PodSelector = &metav1.LabelSelector{MatchLabels: pod}
		}
		return &api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
	}
	privileged := map[string]api.SharingPolicySpec{
		"critical":       {LatencyClass: api.LatencyCritical, MaxCoTenants: ptr.To[int32](1)},
		"maxTenants":     {MaxTenantsPerGPU: ptr.To[int32](2)},
		"exclusive":      {Isolation: api.IsolationExclusive},
		"none":           {Isolation: api.IsolationNone},
		"allowSharedGPU": {AllowSharedGPU: true},
	}
	base := pol("team", 0, serving, nil, api.SharingPolicySpec{LatencyClass: api.LatencyBestEffort})
	for name, spec := range privileged {
		t.Run(name, func(t *testing.T) {
			if got := Resolve([]*api.SharingPolicy{base, pol("labels-only", 100, nil, critical, spec)}, serving, critical); got.Name != "team" {
				t.Errorf("a pod labelled into a podSelector-only %s policy got %q, want the namespace's own", name, got.Name)
			}
			empty := pol("empty-ns-selector", 100, nil, critical, spec)
			empty.Spec.NamespaceSelector = &metav1.LabelSelector{}
			if got := Resolve([]*api.SharingPolicy{base, empty}, serving, critical); got.Name != "team" {
				t.Errorf("an empty namespaceSelector bound %s to every namespace: got %q", name, got.Name)
			}
			bound := pol("bound", 100, serving, critical, spec)
			if got := Resolve([]*api.SharingPolicy{base, bound}, serving, critical); got.Name != "bound" {
				t.Errorf("a policy bound to the namespace, chosen by label, got %q", got.Name)
			}
			if got := Resolve([]*api.SharingPolicy{bound}, map[string]string{"tier": "batch"}, critical); got.Name != "" {
				t.Errorf("a pod of another namespace got %q by its label", got.Name)
			}
			if got := Resolve([]*api.SharingPolicy{pol("everyone", 100, nil, nil, spec)}, serving, critical); got.Name != "everyone" {
				t.Errorf("a policy without selectors (the admin's, for every pod) got %q", got.Name)
			}
		})
	}
	free := pol("best-effort", 100, nil, map[string]string{"batch": "yes"}, api.SharingPolicySpec{LatencyClass: api.LatencyBestEffort, Mode: api.PolicyModeTimeSlicing})
	if got := Resolve([]*api.SharingPolicy{free}, serving, map[string]string{"batch": "yes"}); got.Name != "best-effort" {
		t.Errorf("a podSelector-only policy without privileges does not apply by label: got %q", got.Name)
	}
}

// A namespace's quota binds every claim in it, whatever policy its pod labels select: pod
// labels are the tenant's, the quota is not.
func TestNamespaceQuota(t *testing.T) {
	type pol = *api.SharingPolicy
	mk := func(name string, prio int32, ns, pod map[string]string, mem string, comp int64) pol {
		p := &api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: api.SharingPolicySpec{Priority: prio}}
		if ns != nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
		}
		if pod != nil {
			p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: pod}
		}
		if mem != "" || comp >= 0 {
			p.Spec.Quota = &api.Quota{}
		}
		if mem != "" {
			p.Spec.Quota.Memory = ptr.To(resource.MustParse(mem))
		}
		if comp >= 0 {
			p.Spec.Quota.Compute = ptr.To(comp)
		}
		return p
	}
	ml := map[string]string{"team": "ml"}
	badExpr := func(p pol, op metav1.LabelSelectorOperator, values ...string) pol {
		if p.Spec.NamespaceSelector == nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{}
		}
		p.Spec.NamespaceSelector.MatchExpressions = append(p.Spec.NamespaceSelector.MatchExpressions,
			metav1.LabelSelectorRequirement{Key: "team", Operator: op, Values: values})
		return p
	}
	for name, tc := range map[string]struct {
		pols              []pol
		ns, pod           map[string]string
		mem, memFrom      string // "" when no memory limit
		comp              int64  // -1 when no compute limit
		compFrom, invalid string
		policy            string // what Resolve picks for co-tenancy
	}{
		"no policy": {nil, ml, nil, "", "", -1, "", "", ""},
		"pod label into a quota-free higher-priority policy": {
			[]pol{mk("quota", 0, ml, nil, "80Gi", -1), mk("escape", 100, nil, map[string]string{"x": "y"}, "", -1)},
			ml, map[string]string{"x": "y"}, "80Gi", "quota", -1, "", "", "escape"},
		"a pod-selected policy's quota binds pods it does not select": {
			[]pol{mk("critical", 10, nil, map[string]string{"tier": "critical"}, "40Gi", -1)},
			ml, map[string]string{}, "40Gi", "critical", -1, "", "", ""},
		"smallest limit binds, per resource": {
			[]pol{mk("a", 0, ml, nil, "80Gi", 50), mk("b", 5, nil, nil, "40Gi", 200), mk("c", 0, map[string]string{"team": "other"}, nil, "1Gi", 1)},
			ml, nil, "40Gi", "b", 50, "a", "", "b"},
		"equal limits: first name": {
			[]pol{mk("z", 0, nil, nil, "40Gi", -1), mk("y", 0, nil, nil, "40Gi", -1)},
			ml, nil, "40Gi", "y", -1, "", "", "y"},
		"namespace not selected": {
			[]pol{mk("a", 0, map[string]string{"team": "other"}, nil, "1Gi", -1)},
			ml, nil, "", "", -1, "", "", ""},
		"deleted policy binds nothing": {
			[]pol{func() pol { p := mk("a", 0, nil, nil, "1Gi", -1); p.DeletionTimestamp = &metav1.Time{}; return p }()},
			ml, nil, "", "", -1, "", "", ""},
		"invalid quota fails closed": {
			[]pol{mk("neg", 0, nil, nil, "-1Gi", -1), mk("ok", 0, nil, nil, "80Gi", -1)},
			ml, nil, "80Gi", "ok", -1, "", "neg", "ok"},
		"invalid selector that may select the namespace": {
			[]pol{badExpr(mk("bad", 0, ml, nil, "1Gi", -1), metav1.LabelSelectorOpIn)},
			ml, nil, "", "", -1, "", "bad", ""},
		"invalid selector whose valid part rules the namespace out": {
			[]pol{badExpr(mk("bad", 0, map[string]string{"team": "other"}, nil, "1Gi", -1), metav1.LabelSelectorOpExists, "x")},
			ml, nil, "", "", -1, "", "", ""},
		"invalid selector, a valid expression rules the namespace out": {
			[]pol{badExpr(badExpr(mk("bad", 0, nil, nil, "1Gi", -1), metav1.LabelSelectorOpNotIn, "ml"), metav1.LabelSelectorOpIn)},
			ml, nil, "", "", -1, "", "", ""},
		"invalid pod selector: the quota still cannot be trusted": {
			[]pol{func() pol {
				p := mk("bad", 0, nil, nil, "1Gi", -1)
				p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}
				return p
			}()},
			ml, nil, "", "", -1, "", "bad", ""},
		"invalid policy without a quota is only skipped": {
			[]pol{badExpr(mk("bad", 0, nil, nil, "", -1), metav1.LabelSelectorOpIn)},
			ml, nil, "", "", -1, "", "", ""},
	} {
		t.Run(name, func(t *testing.T) {
			e := Resolve(tc.pols, tc.ns, tc.pod)
			q := e.Quota
			if e.Name != tc.policy {
				t.Errorf("policy %q, want %q", e.Name, tc.policy)
			}
			switch {
			case tc.mem == "" && q.Memory != nil:
				t.Errorf("memory quota %s from %q, want none", q.Memory, q.MemoryFrom)
			case tc.mem != "" && (q.Memory == nil || q.Memory.Cmp(resource.MustParse(tc.mem)) != 0 || q.MemoryFrom != tc.memFrom):
				t.Errorf("memory quota %v from %q, want %s from %q", q.Memory, q.MemoryFrom, tc.mem, tc.memFrom)
			}
			switch {
			case tc.comp < 0 && q.Compute != nil:
				t.Errorf("compute quota %d from %q, want none", *q.Compute, q.ComputeFrom)
			case tc.comp >= 0 && (q.Compute == nil || *q.Compute != tc.comp || q.ComputeFrom != tc.compFrom):
				t.Errorf("compute quota %v from %q, want %d from %q", q.Compute, q.ComputeFrom, tc.comp, tc.compFrom)
			}
			switch {
			case tc.invalid == "" && q.Invalid != nil:
				t.Errorf("invalid %v, want none", q.Invalid)
			case tc.invalid != "" && (q.Invalid == nil || q.Invalid.Policy != tc.invalid):
				t.Errorf("invalid %v, want policy %q", q.Invalid, tc.invalid)
			}
		})
	}
}

// quota.heldRoom: Refuse binds on its own, with no memory or compute limit, in every
// namespace the policy's namespaceSelector selects; the alphabetically first such policy is
// named; Charge, or a policy of other namespaces, refuses nothing.
func TestNamespaceQuotaRefusesHeldRoom(t *testing.T) {
	mk := func(name string, ns map[string]string, rule api.HeldRoomRule) *api.SharingPolicy {
		p := &api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: api.SharingPolicySpec{Quota: &api.Quota{HeldRoom: rule}}}
		if ns != nil {
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: ns}
		}
		return p
	}
	ml, other := map[string]string{"team": "ml"}, map[string]string{"team": "other"}
	for name, tc := range map[string]struct {
		pols []*api.SharingPolicy
		from string // "" when held room is charged
	}{
		"charge":                  {[]*api.SharingPolicy{mk("c", ml, api.HeldRoomCharge)}, ""},
		"refuse alone":            {[]*api.SharingPolicy{mk("r", ml, api.HeldRoomRefuse)}, "r"},
		"refuse for all":          {[]*api.SharingPolicy{mk("r", nil, api.HeldRoomRefuse)}, "r"},
		"refuse elsewhere":        {[]*api.SharingPolicy{mk("r", other, api.HeldRoomRefuse)}, ""},
		"first refusing name":     {[]*api.SharingPolicy{mk("z", ml, api.HeldRoomRefuse), mk("c", ml, api.HeldRoomCharge), mk("b", nil, api.HeldRoomRefuse)}, "b"},
		"charge does not lift":    {[]*api.SharingPolicy{mk("a", ml, api.HeldRoomCharge), mk("r", ml, api.HeldRoomRefuse)}, "r"},
		"unknown rule is skipped": {[]*api.SharingPolicy{mk("x", ml, "Ignore")}, ""},
	} {
		q := NamespaceQuota(tc.pols, ml)
		if q.RefuseHeldRoom != (tc.from != "") || q.RefuseHeldRoomFrom != tc.from {
			t.Errorf("%s: refuse %v from %q, want from %q", name, q.RefuseHeldRoom, q.RefuseHeldRoomFrom, tc.from)
		}
		if q.Binds() {
			t.Errorf("%s: binds memory or compute: %+v", name, q)
		}
	}
}
