package controller

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

func celSelector(expr string) []resourceapi.DeviceSelector {
	return []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}}
}

// The per-GPU selector memo is indexed by interned selector: when the interning starts
// over, a new expression may reuse the index of an old one, and must not inherit its verdict.
func TestSelectorMemoSurvivesInterningReset(t *testing.T) {
	c := New(DefaultConfig(), fake.NewClientset(), nil, nil)
	g := &gpu{attrs: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"index": {IntValue: ptr.To(int64(3))}}}
	ctx := context.Background()
	no := c.model.selectors.refs(celSelector(`device.attributes["gpu.fgpu.dev"].index == 7`))
	if ok, _ := c.selectorsMatch(ctx, g, no); ok {
		t.Fatal("index 3 matched index == 7")
	}
	for i := 0; i < maxSelectors-1; i++ { // fills the table: the next one starts it over
		c.model.selectors.refs(celSelector(fmt.Sprintf("device.attributes[\"gpu.fgpu.dev\"].index != %d", 100+i)))
	}
	yes := c.model.selectors.refs(celSelector(`device.attributes["gpu.fgpu.dev"].index == 3`))
	if yes[0].id != no[0].id {
		t.Fatalf("the test needs the new selector at the old one's index: %d vs %d", yes[0].id, no[0].id)
	}
	if ok, _ := c.selectorsMatch(ctx, g, yes); !ok {
		t.Error("index 3 did not match index == 3: the memo kept the old selector's verdict")
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
	if st := e.claim("a", "c").Annotations[AnnotationStatus]; st != want {
		t.Errorf("status\n%q, want\n%q", st, want)
	}
	if len(e.events("CEL runtime error")) == 0 {
		t.Error("no event shows the CEL error")
	}
}
