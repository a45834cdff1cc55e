package plugin

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// burstPlacement is the allocator's placement with a burst cap, plus other config fields.
func burstPlacement(limit string, fields map[string]any) map[string]any {
	pl := map[string]any{"memoryLimit": limit}
	out := map[string]any{"placement": pl}
	for k, v := range fields {
		if k == "allowSharedGPU" {
			pl[k] = v
			continue
		}
		out[k] = v
	}
	return out
}

// A burst cap (the allocator's placement.memoryLimit) is honoured only for an MPS share in
// allocator mode on a GPU no other domain may use, from the allocator's placement, within
// the GPU; the container is told both sizes. Anything else refuses the prepare and says why.
func TestBurstCap(t *testing.T) {
	const refusedPrefix = "refusing the burst cap placement.memoryLimit "
	for name, tc := range map[string]struct {
		fenced bool
		claim  *resourceapi.ResourceClaim
		limit  string // FGPU_MEMORY_LIMIT when prepared
		err    string // what the refusal says; "" when prepared
	}{
		"fenced MPS share on a single-domain GPU": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", nil)).Obj(), "30Gi", ""},
		"a cap of the whole GPU": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("79Gi", nil)).Obj(), "79Gi", ""},
		// The allocator's placement comes last and replaces the tenant's whole.
		"a cap the tenant wrote, replaced by the allocator's placement": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").Config(burstPlacement("70Gi", nil)).AllocatedOn(node, "gpu-0").AllocatorConfig(keepGPU).Obj(), "10Gi", ""},
		"a cap the tenant wrote, with no placement after it": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").Config(burstPlacement("70Gi", nil)).AllocatedOn(node, "gpu-0").Obj(), "", "70Gi: the claim's own config sets it, and only the fgpu allocator may write placement"},
		"a cap the tenant wrote, and the allocator's": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").Config(burstPlacement("70Gi", nil)).AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", nil)).Obj(), "", "30Gi: the claim's own config sets it"},
		"scheduler mode": {false,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", nil)).Obj(), "", "30Gi: the plugin runs in scheduler mode"},
		"other domains may share the GPU": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", map[string]any{"allowSharedGPU": true})).Obj(), "", "30Gi: the placement lets other isolation domains use the GPU"},
		"time-slicing": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", map[string]any{"mode": "timeSlicing"})).Obj(), "", "30Gi: the share is timeSlicing, which enforces no memory cap"},
		"a whole GPU": {true,
			builders.MakeClaim("ns", "c").Class(configapi.DeviceClassExclusive).AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("79Gi", nil)).Obj(), "", "79Gi: the share holds the whole GPU"},
		"the claim's own memoryLimit": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").Config(map[string]any{"memoryLimit": "8Gi"}).AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("30Gi", nil)).Obj(), "", "30Gi: the claim's config also sets memoryLimit 8Gi"},
		"below the allocation": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("5Gi", nil)).Obj(), "", "5Gi: it is below the 10Gi allocated to the share"},
		"above the allocatable": {true,
			builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("80Gi", nil)).Obj(), "", "80Gi: it is above GPU gpu-0's 79Gi allocatable"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Fenced = tc.fenced
			s := e.state()
			devs, err := s.Prepare(context.Background(), tc.claim)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), refusedPrefix+tc.err) {
					t.Fatalf("got %v, want a refusal saying %q", err, refusedPrefix+tc.err)
				}
				if _, ok := s.PreparedClaims()[string(tc.claim.UID)]; ok || e.specCount() != 0 {
					t.Errorf("the refused claim left an entry or a spec (%d specs)", e.specCount())
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := fgpuEnv(e.containerEnv(devs[0].CDIDeviceIDs...))
			p := s.PreparedClaims()[string(tc.claim.UID)].Devices[0]
			want := map[string]string{
				"FGPU_MEMORY_LIMIT": tc.limit, "FGPU_MEMORY_LIMIT_BYTES": strconv.FormatInt(p.MemoryLimitBytes, 10),
				"FGPU_MEMORY_GUARANTEED": "10Gi", "FGPU_MEMORY_GUARANTEED_BYTES": "10737418240",
				"FGPU_MEMORY_ENFORCED": "true", "FGPU_SHARING_MODE": "mps",
			}
			for k, v := range want {
				if got[k] != v || got[k+"_0"] != v {
					t.Errorf("%s=%q, %s_0=%q, want %q", k, got[k], k, got[k+"_0"], v)
				}
			}
			if bytesStr(p.MemoryLimitBytes) != tc.limit || p.MemoryBytes != 10<<30 {
				t.Errorf("checkpoint: limit %d, memory %d", p.MemoryLimitBytes, p.MemoryBytes)
			}
			if mps := "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=" + strconv.FormatInt(p.MemoryLimitBytes>>20, 10) + "M"; !slices.Contains(e.specEnv(string(tc.claim.UID)), mps) {
				t.Errorf("want %s: %v", mps, e.specEnv(string(tc.claim.UID)))
			}
			// The MPS server's default is its domain's largest cap.
			if d := s.domainLimits(p.MPSKey); d.PinnedMemBytes != p.MemoryLimitBytes {
				t.Errorf("MPS server default %d, want the cap %d", d.PinnedMemBytes, p.MemoryLimitBytes)
			}
			burst := strings.Contains(got["FGPU_MEMORY_ENFORCEMENT"], "burst: the cap (FGPU_MEMORY_LIMIT) is above the guaranteed memory (FGPU_MEMORY_GUARANTEED), "+
				"and the guarantee holds only while the GPU's other tenants (all of this namespace and isolation domain) stay within theirs")
			if burst != (tc.limit != "10Gi") {
				t.Errorf("FGPU_MEMORY_ENFORCEMENT=%q: a burst share, and only one, says so", got["FGPU_MEMORY_ENFORCEMENT"])
			}
		})
	}
}

// A burst share counts its guaranteed memory on the GPU, not its cap, and keeps its cap
// through a restart and a rebuilt checkpoint; its pod's dmem.max is the cap.
func TestBurstCapSurvivesRestartAndCapsThePod(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	dmemMax := podCgroup(t, e.cgroupRoot(), podA)
	s := e.state()
	ctx := context.Background()
	burst := reserved(builders.MakeClaim("ns", "burst").Memory("10Gi").Created(1).AllocatedOn(node, "gpu-0").AllocatorConfig(burstPlacement("70Gi", nil)).Obj())
	other := reserved(builders.MakeClaim("ns", "other").Memory("60Gi").Created(2).AllocatedOn(node, "gpu-0").AllocatorConfig(keepGPU).Obj())
	if _, err := s.PrepareFor(ctx, burst, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, dmemMax); got != gpu0Region+" 75161927680\n" {
		t.Errorf("dmem.max %q, want the 70Gi cap", got)
	}
	if _, err := s.Prepare(ctx, other); err != nil {
		t.Fatalf("10Gi guaranteed and 60Gi fit a 79Gi GPU: %v", err)
	}
	before := s.PreparedClaims()[string(burst.UID)].Devices
	if !strings.HasPrefix(before[0].MemoryEnforcement, "cgroup: ") {
		t.Errorf("enforcement %q", before[0].MemoryEnforcement)
	}

	check := func(what string, st *State) {
		t.Helper()
		if got := st.PreparedClaims()[string(burst.UID)].Devices; !devicesEqual(got, before) || got[0].MemoryLimitBytes != 70<<30 {
			t.Errorf("%s: %+v, was %+v", what, got, before)
		}
	}
	check("restart", e.state())

	e.client = fake.NewClientset(burst, other)
	if err := os.WriteFile(e.cfg.CheckpointPath(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	check("rebuilt checkpoint", e.state())
}
