package controller

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
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
	if c.selectorsMatch(ctx, g, no) {
		t.Fatal("index 3 matched index == 7")
	}
	for i := 0; i < maxSelectors-1; i++ { // fills the table: the next one starts it over
		c.model.selectors.refs(celSelector(fmt.Sprintf("device.attributes[\"gpu.fgpu.dev\"].index != %d", 100+i)))
	}
	yes := c.model.selectors.refs(celSelector(`device.attributes["gpu.fgpu.dev"].index == 3`))
	if yes[0].id != no[0].id {
		t.Fatalf("the test needs the new selector at the old one's index: %d vs %d", yes[0].id, no[0].id)
	}
	if !c.selectorsMatch(ctx, g, yes) {
		t.Error("index 3 did not match index == 3: the memo kept the old selector's verdict")
	}
}
