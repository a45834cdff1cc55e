package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/gang"
)

const block = "network.topology.nvidia.com/block"

// A gang's next pod goes to a node of the block its other pods are on, where the core
// alone would pick another; what the pod itself requires, and other namespaces' pods with
// the same labels, do not bend to it.
func TestGangPodsStayInTheirBlock(t *testing.T) {
	for _, tc := range []struct {
		name string
		objs []runtime.Object
		want string
	}{{
		name: "the gang's block",
		objs: []runtime.Object{builders.MakePod("t", "worker-0").Label(gang.LabelJobSet, "train").Bound("n1").Obj(),
			builders.MakePod("t", "p").Label(gang.LabelJobSet, "train").Claim("c").Obj()},
		want: "n3/gpu-0",
	}, {
		name: "no gang",
		objs: []runtime.Object{builders.MakePod("t", "worker-0").Label(gang.LabelJobSet, "train").Bound("n1").Obj(),
			builders.MakePod("t", "p").Claim("c").Obj()},
		want: "n2/gpu-0",
	}, {
		name: "another namespace's gang of the same name",
		objs: []runtime.Object{builders.MakePod("other", "worker-0").Label(gang.LabelJobSet, "train").Bound("n1").Obj(),
			builders.MakePod("t", "p").Label(gang.LabelJobSet, "train").Claim("c").Obj()},
		want: "n2/gpu-0",
	}, {
		name: "the pod's own node selector (Kueue's topology assignment) wins",
		objs: []runtime.Object{builders.MakePod("t", "worker-0").Label(gang.LabelJobSet, "train").Bound("n1").Obj(),
			builders.MakePod("t", "p").Label(gang.LabelJobSet, "train").NodeSelector(block, "b2").Claim("c").Obj()},
		want: "n2/gpu-0",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{
				builders.MakeNode("n1").Label(block, "b1").Obj(),
				builders.MakeNode("n2").Label(block, "b2").Obj(), builders.MakeSlice("n2", 1, "80Gi"),
				builders.MakeNode("n3").Label(block, "b1").Obj(), builders.MakeSlice("n3", 1, "80Gi"),
				builders.MakeClaim("t", "c").Memory("10Gi").Obj(),
			}
			e := newEnv(t, nil, append(objs, tc.objs...)...)
			e.run()
			if got := e.placedOn("t", "c"); got != tc.want {
				t.Fatalf("placed on %q, want %q", got, tc.want)
			}
		})
	}
}
