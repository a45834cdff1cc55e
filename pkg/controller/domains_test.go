package controller

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// domainsOn is the isolation domain of each claim (namespace/name) on a GPU, as the model
// holds it.
func domainsOn(e *env, node, device string) map[string]string {
	out := map[string]string{}
	tenants, _, _ := e.c.model.GPUTenants(model.GPUKey{Pool: node, Device: device})
	for _, t := range tenants {
		out[t.Key] = t.Domain.String()
	}
	return out
}

func claimNaming(ns, name, sub string, created int) []runtime.Object {
	cb := builders.MakeClaim(ns, name).Memory("10Gi").Created(created)
	if sub != "" {
		cb = cb.Config(map[string]any{"isolationDomain": sub})
	}
	return []runtime.Object{cb.Obj(), builders.MakePod(ns, name).Claim(name).Obj()}
}

// A claim's isolationDomain only subdivides its own namespace: naming another namespace, its
// readable domain or the same sub-domain as another namespace never joins that domain.
func TestDomainNamesStayInTheirNamespace(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi")}
	objs = append(objs, claimNaming("victim", "v", "", 0)...)
	objs = append(objs, claimNaming("attacker", "same", "default", 1)...)
	objs = append(objs, claimNaming("attacker", "ns", "ns-victim", 2)...)
	objs = append(objs, claimNaming("attacker", "name", "victim", 3)...)

	// Without allowSharedGPU the attacker's claims never reach the victim's GPU.
	e := newEnv(t, nil, objs...)
	e.run()
	if e.placedOn("victim", "v") != "n1/gpu-0" {
		t.Fatal("victim not placed")
	}
	for _, c := range []string{"same", "ns", "name"} {
		if got := e.placedOn("attacker", c); got != "" {
			t.Errorf("attacker/%s placed on the victim's GPU %s", c, got)
		}
	}
	if ev := e.events("isolation: used by another namespace or isolation domain"); len(ev) == 0 {
		t.Errorf("no event says why the attacker waits: %v", e.events(""))
	}

	// Isolation none and allowSharedGPU share the GPU, never the domain.
	for _, pol := range []*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Obj(), builders.MakePolicy("shared").AllowShared().Obj()} {
		e := newEnv(t, []*api.SharingPolicy{pol}, objs...)
		e.run()
		doms := domainsOn(e, "n1", "gpu-0")
		want := map[string]string{"victim/v": "victim/default", "attacker/same": "attacker/default", "attacker/ns": "attacker/ns-victim", "attacker/name": "attacker/victim"}
		for k, d := range want {
			if doms[k] != d {
				t.Errorf("%s: %s in domain %q, want %q (all: %v)", pol.Name, k, doms[k], d, doms)
			}
		}
		if c := allocCfg(t, e.claim("attacker", "name")); c.IsolationDomain != "victim" || c.Placement == nil || !c.Placement.AllowSharedGPU {
			t.Errorf("%s: allocator config %+v", pol.Name, c)
		}
		if ev := e.events("domain victim/default"); len(ev) == 0 {
			t.Errorf("%s: the placement event does not name the domain: %v", pol.Name, e.events("FgpuPlaced"))
		}
	}
}

// Namespaces of 63 characters that differ only at the end get different domains, and
// without allowSharedGPU different GPUs.
func TestLongNamespacesGetTheirOwnDomains(t *testing.T) {
	prefix := strings.Repeat("n", 60)
	ns1, ns2 := prefix+"abc", prefix+"abd"
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi")}
	objs = append(objs, claimNaming(ns1, "c", "", 0)...)
	objs = append(objs, claimNaming(ns2, "c", "", 1)...)
	e := newEnv(t, nil, objs...)
	e.run()
	p1, p2 := e.placedOn(ns1, "c"), e.placedOn(ns2, "c")
	if p1 == "" || p2 == "" || p1 == p2 {
		t.Fatalf("placed on %q and %q: two namespaces shared a GPU without allowSharedGPU", p1, p2)
	}
	d1 := domainsOn(e, "n1", strings.TrimPrefix(p1, "n1/"))[ns1+"/c"]
	d2 := domainsOn(e, "n1", strings.TrimPrefix(p2, "n1/"))[ns2+"/c"]
	if d1 != ns1+"/default" || d2 != ns2+"/default" {
		t.Errorf("domains %q %q", d1, d2)
	}
}

// A claim that names no mode is MPS: it never becomes time-sliced (no memory cap) because
// another tenant's claim made a GPU time-sliced. It goes to another GPU, or waits saying why.
func TestModeAutoNeverTimeSliced(t *testing.T) {
	pols := []*api.SharingPolicy{builders.MakePolicy("none").Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj()}
	sliced := []runtime.Object{builders.MakeClaim("a", "ts").Memory("10Gi").Config(map[string]any{"mode": "timeSlicing"}).Obj(), builders.MakePod("a", "ts").Claim("ts").Obj()}
	auto := claimNaming("b", "auto", "", 1)

	e := newEnv(t, pols, append([]runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi")}, sliced...)...)
	e.run()
	if e.placedOn("a", "ts") != "n1/gpu-0" {
		t.Fatal("time-sliced claim not placed")
	}
	e.create(auto...)
	e.run()
	if got := e.placedOn("b", "auto"); got != "" {
		t.Fatalf("a claim without a mode was placed on the time-sliced GPU %s as %s", got, allocCfg(t, e.claim("b", "auto")).Mode)
	}
	if ev := e.events("its tenants use another sharing mode (e.g. n1/gpu-0 is timeSlicing, the claim mps)"); len(ev) == 0 {
		t.Errorf("no event says why: %v", e.events("b"))
	}

	e2 := newEnv(t, pols, append([]runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi")}, sliced...)...)
	e2.run()
	e2.create(auto...)
	e2.run()
	if got := e2.placedOn("b", "auto"); got == "" || got == e2.placedOn("a", "ts") {
		t.Fatalf("claim without a mode placed on %q, the time-sliced claim on %q", got, e2.placedOn("a", "ts"))
	}
	if m := allocCfg(t, e2.claim("b", "auto")).Mode; m != api.SharingModeMPS {
		t.Errorf("mode %s, want mps", m)
	}
}

// A claim placed where its memory cap does not bind every process says so: on the claim, in
// its status annotation and on its pods; one placed where it does gets no such warning.
func TestMemoryNotEnforcedIsTold(t *testing.T) {
	for name, tc := range map[string]struct {
		pol  *api.SharingPolicy
		cfg  map[string]any
		want string // "" : no warning
	}{
		"isolated":       {nil, nil, ""},
		"shared GPU":     {builders.MakePolicy("shared").AllowShared().Obj(), nil, "SharingPolicy shared lets other isolation domains share the GPU with their own MPS servers, so a process that bypasses MPS is not capped"},
		"isolation none": {builders.MakePolicy("none").Isolation(api.IsolationNone).Obj(), nil, "SharingPolicy none lets other isolation domains share the GPU"},
		"time-slicing":   {nil, map[string]any{"mode": "timeSlicing"}, "time-slicing: no memory cap"},
	} {
		t.Run(name, func(t *testing.T) {
			var pols []*api.SharingPolicy
			if tc.pol != nil {
				pols = append(pols, tc.pol)
			}
			cb := builders.MakeClaim("a", "c").Memory("10Gi")
			if tc.cfg != nil {
				cb = cb.Config(tc.cfg)
			}
			e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), cb.Obj(), builders.MakePod("a", "p").Claim("c").Obj())
			e.run()
			if e.placedOn("a", "c") == "" {
				t.Fatal("not placed")
			}
			ev := e.events(ReasonMemoryNotEnforced)
			if tc.want == "" {
				if len(ev) != 0 {
					t.Errorf("warned %v", ev)
				}
				return
			}
			// One on the claim, one on the pod (which names the claim).
			if len(ev) != 2 || !strings.Contains(ev[0], tc.want) || !strings.Contains(ev[1], tc.want) || !strings.Contains(ev[0]+ev[1], "claim c: ") {
				t.Errorf("events %v, want two saying %q", ev, tc.want)
			}
			if st := e.claim("a", "c").Annotations[api.AnnotationStatus]; !strings.Contains(st, "not enforced") {
				t.Errorf("status annotation %q does not say memory is not enforced", st)
			}
		})
	}
}
