package model

import (
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func gpu80(name string) resourceapi.Device {
	return resourceapi.Device{Name: name, Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		api.CapacityMemory:  {Value: resource.MustParse("80Gi")},
		api.CapacityCompute: {Value: resource.MustParse("100")},
	}}
}

// allocated is claim ns/name holding mem on n1/gpu-0.
func allocated(ns, name string, mem string) *resourceapi.ResourceClaim {
	share := types.UID(name + "-share")
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: api.DriverName, Pool: "n1", Device: "gpu-0", ShareID: &share,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem), api.CapacityCompute: resource.MustParse("10")}}},
		}}},
	}
}

// A decision's shares count at once, for the GPU and the namespace's quota; the informer not
// showing the allocation yet does not drop them until WriteSettle has passed, and a claim
// the informer shows is recorded from its allocation alone.
func TestTransactionsAndTheInformerAgree(t *testing.T) {
	m := New(api.DriverName)
	m.SetNodeDevices("n1", map[string]resourceapi.Device{"gpu-0": gpu80("gpu-0")})
	k := GPUKey{Pool: "n1", Device: "gpu-0"}
	now := time.Unix(1000, 0)
	m.Update(func(tx *Tx) {
		g, ok := tx.GPU(k)
		if !ok {
			t.Fatal("the published GPU is not in the model")
		}
		c := NewClaim("a", "team/a", "team", now)
		c.AddShare(g, &Tenant{Claim: "a", Key: "team/a", Namespace: "team", ShareID: "s1", Mem: 10 << 30, Comp: 10})
		tx.Add(c)
		if got := tx.Charged("team"); got != (Usage{Mem: 10 << 30, Comp: 10}) {
			t.Errorf("charged %v", got)
		}
		if !tx.DecidedUnseen("team/a", now.Add(time.Second)) {
			t.Error("a decision the informer has not shown yet may be decided again")
		}
	})
	if u := m.UseOf(k); u != (Use{Mem: 10 << 30, Comp: 10, Tenants: 1}) {
		t.Errorf("GPU holds %+v", u)
	}
	unallocated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "a", UID: "a"}}
	if m.Account(unallocated, now.Add(time.Second)) || m.UseOf(k).Tenants != 1 {
		t.Error("the allocator's own write, not shown yet, was dropped")
	}
	if !m.Account(unallocated, now.Add(WriteSettle+time.Second)) || m.UseOf(k).Tenants != 0 {
		t.Error("a decision the informer contradicted past WriteSettle was kept")
	}
	if m.Account(allocated("team", "b", "20Gi"), now) {
		t.Error("a new claim reported capacity freed")
	}
	if u := m.ByNamespace()["team"]; u.Claims != 1 || u.Mem != 20<<30 {
		t.Errorf("namespace holds %+v", u)
	}
	if m.Account(allocated("team", "b", "20Gi"), now) {
		t.Error("the same allocation twice reported capacity freed")
	}
	// A GPU its slice no longer publishes stays while a tenant holds it, and goes with it.
	m.SetNodeDevices("n1", nil)
	if tenants, _, published := m.GPUTenants(k); len(tenants) != 1 || published {
		t.Errorf("unpublished GPU: %d tenants, published %v", len(tenants), published)
	}
	if !m.Release("team/b") {
		t.Error("the claim was not released")
	}
	if tenants, _, _ := m.GPUTenants(k); len(tenants) != 0 || m.GPUMemory(k) != 0 {
		t.Error("an unpublished GPU stayed after its last tenant")
	}
}
