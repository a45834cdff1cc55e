package controller

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
)

func celSelector(expr string) []resourceapi.DeviceSelector {
	return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
}

// attackClaim is the claim of issue 24's attack: 8 subrequests of 32 selectors each, every
// list ending in a selector no device matches (a GPU index of 99), with expressions no other
// claim has (tag).
func attackClaim(ns, name string, tag int) *resourceapi.ResourceClaim {
	c := builders.MakeClaim(ns, name).Obj()
	var subs []resourceapi.DeviceSubRequest
	for i := range 8 {
		var sels []resourceapi.DeviceSelector
		for j := range 31 {
			sels = append(sels, celSelector(fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index != %d`, 1000+tag*1000+i*32+j))...)
		}
		sels = append(sels, celSelector(`device.attributes["gpu.fgpu.dev"].index == 99`)...)
		subs = append(subs, resourceapi.DeviceSubRequest{Name: fmt.Sprintf("s%d", i), DeviceClassName: c.Spec.Devices.Requests[0].Exactly.DeviceClassName,
			Selectors: sels, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
			Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}}})
	}
	c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: subs}
	return c
}

// Claims with more distinct selectors than the memo holds are never placed on a device their
// selectors exclude, and a victim's selector placed after them is its own.
func TestSelectorsNeverMatchWhatTheyExclude(t *testing.T) {
	var objs []runtime.Object
	objs = append(objs, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"))
	for i := range 3 {
		name := fmt.Sprintf("c%d", i)
		objs = append(objs, attackClaim("attacker", name, i), builders.MakePod("attacker", "p"+name).Claim(name).Obj())
	}
	victim := builders.MakeClaim("victim", "c").Memory("10Gi").Created(10).Obj()
	victim.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == 2`)
	objs = append(objs, victim, builders.MakePod("victim", "p").Claim("c").Obj())
	e := newEnvWith(t, func(c *Config) {
		c.Selectors = selectors.DefaultOptions(c.DriverName)
		c.Selectors.MemoBytes, c.Selectors.NamespaceBurst = 4<<10, 1<<40
	}, nil, objs...)
	e.run()
	for i := range 3 {
		if got := e.placedOn("attacker", fmt.Sprintf("c%d", i)); got != "" {
			t.Errorf("attacker/c%d placed on %s, which its selectors exclude", i, got)
		}
	}
	if got := e.placedOn("victim", "c"); got != "n1/gpu-2" {
		t.Errorf("victim placed on %q, want n1/gpu-2", got)
	}
}

// A claim whose selectors cost more than the allocator evaluates for one claim is told so,
// and is not placed; another namespace's claim is.
func TestTooCostlySelectorsAreRefused(t *testing.T) {
	var xs []string
	for i := range 100 {
		xs = append(xs, fmt.Sprint(i))
	}
	l := "[" + strings.Join(xs, ",") + "]"
	costly := builders.MakeClaim("attacker", "c").Memory("1Gi").Obj()
	costly.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(l + ".all(x, " + l + ".all(y, x != -y - 1))")
	e := newEnvWith(t, func(c *Config) {
		c.Selectors = selectors.DefaultOptions(c.DriverName)
		c.Selectors.ClaimBudget = 100_000
	}, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 8, "80Gi"), costly, builders.MakePod("attacker", "p").Claim("c").Obj(),
		builders.MakeClaim("victim", "c").Memory("1Gi").Created(10).Obj(), builders.MakePod("victim", "p").Claim("c").Obj())
	e.run()
	if got := e.placedOn("attacker", "c"); got != "" {
		t.Errorf("the costly claim was placed on %s", got)
	}
	if st := e.claim("attacker", "c").Annotations[api.AnnotationStatus]; !strings.Contains(st, "device selectors cost more than the allocator evaluates for one claim") {
		t.Errorf("status %q does not say why", st)
	}
	if len(e.events(ReasonSelectorsTooCostly)) == 0 {
		t.Errorf("no %s event", ReasonSelectorsTooCostly)
	}
	if e.placedOn("victim", "c") == "" {
		t.Error("the victim was not placed")
	}
}

// A selector that fails to evaluate is shown to the user with its error, as kube-scheduler
// does, rather than as a selector that does not match.
func TestSelectorErrorIsShown(t *testing.T) {
	c := builders.MakeClaim("a", "c").Memory("10Gi").Obj()
	c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].missing == 1`)
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), c, builders.MakePod("a", "p").Claim("c").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "" {
		t.Fatalf("placed on %s", got)
	}
	want := "Pending: no GPU can take 10Gi now: 2 GPU(s): device selector cannot be evaluated (e.g. n1/gpu-0: selector " +
		"`device.attributes[\"gpu.fgpu.dev\"].missing == 1`: CEL runtime error: no such key: missing)"
	if st := e.claim("a", "c").Annotations[api.AnnotationStatus]; st != want {
		t.Errorf("status\n%q, want\n%q", st, want)
	}
	if len(e.events("CEL runtime error")) == 0 {
		t.Error("no event shows the CEL error")
	}
}
