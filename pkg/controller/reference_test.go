package controller

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/reference"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// Events name their object through the client scheme: claims and pods from listers carry
// no kind, so the scheme must know both.
func TestEventReferences(t *testing.T) {
	for _, o := range []runtime.Object{builders.MakeClaim("a", "c").Obj(), builders.MakePod("a", "p").Obj()} {
		ref, err := reference.GetReference(scheme.Scheme, o)
		if err != nil || ref.Kind == "" || ref.APIVersion == "" {
			t.Fatalf("%T: %v %+v", o, err, ref)
		}
	}
}
