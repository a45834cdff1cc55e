package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// rootedSlice publishes len(roots) GPUs on node, GPU i under PCIe root roots[i].
func rootedSlice(node string, roots ...string) *resourceapi.ResourceSlice {
	s := builders.MakeSlice(node, len(roots), "80Gi")
	for i, r := range roots {
		s.Spec.Devices[i].Attributes[api.AttributePCIeRoot] = resourceapi.DeviceAttribute{StringValue: ptr.To(r)}
	}
	return s
}

// addRequest adds a request for count whole GPUs named name.
func addRequest(c *resourceapi.ResourceClaim, name string, count int64) *resourceapi.ResourceClaim {
	c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}})
	return c
}

func match(attr resourceapi.QualifiedName, requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(attr))}
}

func distinct(attr resourceapi.QualifiedName, requests ...string) resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{Requests: requests, DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName(attr))}
}

// devicesOf lists a claim's allocated devices, "request=node/device".
func devicesOf(c *resourceapi.ResourceClaim) []string {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, fmt.Sprintf("%s=%s/%s", r.Request, r.Pool, r.Device))
	}
	slices.Sort(out)
	return out
}

func TestConstraintsChooseDevicesTheyAllow(t *testing.T) {
	const a, b = "pci0000:00", "pci0000:80"
	for _, tc := range []struct {
		name  string
		slice *resourceapi.ResourceSlice
		more  []runtime.Object // other nodes and their slices
		claim *resourceapi.ResourceClaim
		want  []string // allocated devices; nil: waits
		why   string   // in the status while it waits
	}{{
		name:  "two GPUs under one root, where one root has room for them",
		slice: rootedSlice("n1", a, b, b, a),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 2, 0)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{match(api.AttributePCIeRoot)}
			return c
		}(),
		want: []string{"gpu=n1/gpu-0", "gpu=n1/gpu-3"},
	}, {
		name:  "an attribute no GPU has",
		slice: rootedSlice("n1", a, a),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 2, 0)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{match(api.DriverName + "/" + api.AttributeNVLinkIsland)}
			return c
		}(),
		why: "has no attribute gpu.fgpu.dev/nvlinkIsland",
	}, {
		name:  "three GPUs under one root, where no root has three",
		slice: rootedSlice("n1", a, a, b, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 3, 0)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{match(api.AttributePCIeRoot)}
			return c
		}(),
		why: "in one resource.kubernetes.io/pcieRoot (matchAttribute)",
	}, {
		name: "a match across requests, where the first request's natural choice leaves the second none",
		// One GPU fits best under root a (fewest free there); then two more do not fit
		// under a, and the claim is decided again under b.
		slice: rootedSlice("n1", a, a, b, b, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 1, 0)
			c = addRequest(c, "more", 2)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{match(api.AttributePCIeRoot, "gpu", "more")}
			return c
		}(),
		want: []string{"gpu=n1/gpu-2", "more=n1/gpu-3", "more=n1/gpu-4"},
	}, {
		name:  "distinct roots across requests",
		slice: rootedSlice("n1", a, a, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 1, 0)
			c = addRequest(c, "more", 1)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{distinct(api.AttributePCIeRoot)}
			return c
		}(),
		// The first GPU comes from the root with the fewest free (b), the second from a.
		want: []string{"gpu=n1/gpu-2", "more=n1/gpu-0"},
	}, {
		name:  "distinct roots within a request",
		slice: rootedSlice("n1", a, a, b, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 2, 0)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{distinct(api.AttributePCIeRoot)}
			return c
		}(),
		want: []string{"gpu=n1/gpu-0", "gpu=n1/gpu-2"},
	}, {
		name:  "distinct roots, more GPUs than roots",
		slice: rootedSlice("n1", a, a, b, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 3, 0)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{distinct(api.AttributePCIeRoot)}
			return c
		}(),
		why: "each with a different resource.kubernetes.io/pcieRoot (distinctAttribute)",
	}, {
		name: "a match across requests that fits one node only, where the first request's natural node has no room for the rest",
		// n1 sorts first and its root b has the fewest free GPUs; only n2 holds three GPUs
		// under one root.
		slice: rootedSlice("n1", a, b),
		more:  []runtime.Object{builders.MakeNode("n2").Obj(), rootedSlice("n2", a, a, a)},
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 1, 0)
			c = addRequest(c, "more", 2)
			c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{match(api.AttributePCIeRoot, "gpu", "more")}
			return c
		}(),
		want: []string{"gpu=n2/gpu-0", "more=n2/gpu-1", "more=n2/gpu-2"},
	}, {
		name:  "a constraint written many times is told once",
		slice: rootedSlice("n1", a, b),
		claim: func() *resourceapi.ResourceClaim {
			c := wholeGPUs("t", "c", 2, 0)
			for range 32 {
				c.Spec.Devices.Constraints = append(c.Spec.Devices.Constraints, match(api.AttributePCIeRoot))
			}
			return c
		}(),
		why: "2 × a whole GPU in one resource.kubernetes.io/pcieRoot (matchAttribute) now",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			objs := append([]runtime.Object{builders.MakeNode("n1").Obj(), tc.slice, tc.claim, builders.MakePod("t", "p").Claim("c").Obj()}, tc.more...)
			e := newEnv(t, nil, objs...)
			e.run()
			c := e.claim("t", "c")
			got := devicesOf(c)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("devices %v, want %v; status %q", got, tc.want, c.Annotations[api.AnnotationStatus])
			}
			if tc.want == nil && !strings.Contains(c.Annotations[api.AnnotationStatus], tc.why) {
				t.Errorf("status %q, want it to say %q", c.Annotations[api.AnnotationStatus], tc.why)
			}
			e.checkInvariant()
		})
	}
}

// A constraint the allocator cannot honour is refused with a reason, not ignored.
func TestConstraintsTheAllocatorCannotHonourAreRefused(t *testing.T) {
	c := wholeGPUs("t", "c", 2, 0)
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{}}
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), rootedSlice("n1", "r", "r"), c, builders.MakePod("t", "p").Claim("c").Obj())
	e.run()
	got := e.claim("t", "c")
	if devicesOf(got) != nil || !strings.Contains(got.Annotations[api.AnnotationStatus], "neither one matchAttribute nor one distinctAttribute") {
		t.Fatalf("devices %v, status %q", devicesOf(got), got.Annotations[api.AnnotationStatus])
	}
}

// The allocator gives the placement core each GPU's NVLink island from its slice: with three
// GPUs of one island taken, a share goes to that island's last GPU, not to a GPU of the free
// island, which stays whole for work that needs four GPUs of one island.
func TestSharesKeepOffAFreeIsland(t *testing.T) {
	s := builders.MakeSlice("n1", 8, "80Gi")
	for i := range 8 {
		s.Spec.Devices[i].Attributes[api.AttributeNVLinkIsland] = resourceapi.DeviceAttribute{StringValue: ptr.To(fmt.Sprintf("nvl-%d", i/4*4))}
	}
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), s}
	for i := 4; i < 7; i++ {
		name := fmt.Sprintf("whole-%d", i)
		objs = append(objs, builders.MakeClaim("w", name).Class(api.DeviceClassExclusive).Memory("80Gi").AllocatedOn("n1", fmt.Sprintf("gpu-%d", i)).Obj(),
			builders.MakePod("w", name).Claim(name).Bound("n1").Obj())
	}
	objs = append(objs, builders.MakeClaim("t", "c").Memory("10Gi").Obj(), builders.MakePod("t", "p").Claim("c").Obj())
	e := newEnv(t, nil, objs...)
	e.run()
	if got := e.placedOn("t", "c"); got != "n1/gpu-7" {
		t.Fatalf("share placed on %q, want n1/gpu-7, the taken island's last GPU", got)
	}
}
