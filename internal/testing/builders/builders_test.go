package builders

import (
	"testing"

	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func TestAllocatedOnAllocatesWhatTheClaimAsks(t *testing.T) {
	c := MakeClaim("ns", "a").Memory("10Gi").Compute("20").Config(map[string]any{"isolationDomain": "x"}).AllocatedOn("n1", "gpu-1").Obj()
	a := c.Status.Allocation
	r := a.Devices.Results[0]
	if r.Request != "gpu" || r.Driver != api.DriverName || r.Pool != "n1" || r.Device != "gpu-1" {
		t.Fatalf("result %+v", r)
	}
	if m, cp := r.ConsumedCapacity[api.CapacityMemory], r.ConsumedCapacity[api.CapacityCompute]; m.String() != "10Gi" || cp.String() != "20" {
		t.Fatalf("consumed %v", r.ConsumedCapacity)
	}
	if len(a.Devices.Config) != 1 || a.Devices.Config[0].Source != resourceapi.AllocationConfigSourceClaim ||
		string(a.Devices.Config[0].Opaque.Parameters.Raw) != string(c.Spec.Devices.Config[0].Opaque.Parameters.Raw) {
		t.Fatalf("allocation config %+v", a.Devices.Config)
	}
	if sel := a.NodeSelector.NodeSelectorTerms[0].MatchFields[0]; sel.Key != "metadata.name" || len(sel.Values) != 1 || sel.Values[0] != "n1" {
		t.Fatalf("node selector %+v", a.NodeSelector)
	}
	if cp := MakeClaim("ns", "b").Memory("1Gi").AllocatedOn("n1", "gpu-0").Obj().Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityCompute]; cp.Value() != 0 {
		t.Fatalf("a claim that names no compute consumes %s", cp.String())
	}
}

func TestShareIDsAreStableDistinctUUIDs(t *testing.T) {
	sid := func(ns, name string) string {
		return string(*MakeClaim(ns, name).AllocatedOn("n1", "gpu-0").Obj().Status.Allocation.Devices.Results[0].ShareID)
	}
	a, b := sid("ns", "a"), sid("ns", "b")
	if _, err := uuid.Parse(a); err != nil || a == b || a != sid("ns", "a") || sid("other", "a") == a {
		t.Fatalf("share IDs %q %q (%v)", a, b, err)
	}
}
