package invariant

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// claim is claim name of namespace a, allocated on node's device with share ID sid.
func claim(name, node, dev, sid, mem, comp string) *resourceapi.ResourceClaim {
	return builders.MakeClaim("a", name).Memory(mem).Compute(comp).AllocatedOn(node, dev).ShareID(sid).Obj()
}

func TestCheck(t *testing.T) {
	slices := []*resourceapi.ResourceSlice{builders.MakeSlice("n1", 1, "80Gi")}
	for _, tc := range []struct {
		name   string
		claims []*resourceapi.ResourceClaim
		want   string
	}{
		{"fits", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "40Gi", "50"), claim("b", "n1", "gpu-0", "s2", "40Gi", "50")}, ""},
		{"memory", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "40Gi", "0"), claim("b", "n1", "gpu-0", "s2", "41Gi", "0")}, "memory 81Gi"},
		{"compute", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "60"), claim("b", "n1", "gpu-0", "s2", "1Gi", "41")}, "compute 101"},
		{"share twice", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "0"), claim("b", "n1", "gpu-0", "s1", "1Gi", "0")}, "handed out twice"},
		{"claim twice", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-0", "s1", "1Gi", "0"), claim("a", "n1", "gpu-0", "s2", "1Gi", "0")}, "listed twice"},
		{"no device", []*resourceapi.ResourceClaim{claim("a", "n1", "gpu-9", "s1", "1Gi", "0")}, "does not exist"},
		{"wrong node", []*resourceapi.ResourceClaim{func() *resourceapi.ResourceClaim {
			c := claim("a", "n1", "gpu-0", "s1", "1Gi", "0")
			c.Status.Allocation.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values = []string{"n2"}
			return c
		}()}, "node selector names n2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check(tc.claims, slices)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
