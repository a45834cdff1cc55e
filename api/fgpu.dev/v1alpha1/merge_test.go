package v1alpha1

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
)

func opaque(source resourceapi.AllocationConfigSource, driver, params string, requests ...string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{Source: source, Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig"` + params + `}`)}}}}
}

func TestMergeConfigs(t *testing.T) {
	class, claim := resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim
	for name, tc := range map[string]struct {
		configs []resourceapi.DeviceAllocationConfiguration
		request string
		want    GpuConfig
		wantErr string
	}{
		"none: nothing set, not normalized": {request: "gpu"},
		"claim overrides class field by field, whatever the order": {
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(claim, DriverName, `,"mode":"timeSlicing"`),
				opaque(class, DriverName, `,"mode":"mps","computePercent":5,"isolationDomain":"a"`),
				opaque(claim, DriverName, `,"isolationDomain":"b","memoryLimit":"1Gi"`),
			},
			request: "gpu",
			want:    GpuConfig{Mode: SharingModeTimeSlicing, ComputePercent: ptr.To[int32](5), IsolationDomain: "b", MemoryLimit: ptr.To(resource.MustParse("1Gi"))},
		},
		// The allocator's config comes last: its placement replaces a tenant's whole, so a
		// burst cap written into the claim's own config does not survive it.
		"a later placement replaces an earlier one whole": {
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(claim, DriverName, `,"placement":{"memoryLimit":"70Gi","allowSharedGPU":true}`),
				opaque(claim, DriverName, `,"placement":{"policy":"p"}`),
			},
			request: "gpu",
			want:    GpuConfig{Placement: &Placement{Policy: "p"}},
		},
		"later claim config wins": {
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(claim, DriverName, `,"computePercent":10`),
				opaque(claim, DriverName, `,"computePercent":20`),
			},
			request: "gpu",
			want:    GpuConfig{ComputePercent: ptr.To[int32](20)},
		},
		"other requests, drivers and non-opaque configs are skipped": {
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaque(claim, DriverName, `,"mode":"timeSlicing"`, "other"),
				opaque(claim, "nic.example.com", `,"bogus":1`),
				{Source: claim},
				opaque(claim, DriverName, `,"computePercent":30`, "gpu"),
			},
			request: "gpu",
			want:    GpuConfig{ComputePercent: ptr.To[int32](30)},
		},
		"a config for the parent request applies to its subrequest": {
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"mode":"timeSlicing"`, "gpu")},
			request: "gpu/small",
			want:    GpuConfig{Mode: SharingModeTimeSlicing},
		},
		"undecodable": {
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"memmory":"1Gi"`)},
			request: "gpu", wantErr: `unknown field "memmory"`,
		},
		"invalid": {
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(class, DriverName, `,"mode":"vgpu"`)},
			request: "gpu", wantErr: `invalid fgpu config: unknown sharing mode "vgpu"`,
		},
		"an invalid config for another request does not matter": {
			configs: []resourceapi.DeviceAllocationConfiguration{opaque(claim, DriverName, `,"computePercent":500`, "other")},
			request: "gpu",
		},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := MergeConfigs(DriverName, tc.configs, tc.request)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !equalConfig(*got, tc.want) {
				t.Fatalf("got %+v, want %+v", *got, tc.want)
			}
		})
	}
}

func equalConfig(a, b GpuConfig) bool {
	return a.Mode == b.Mode && a.IsolationDomain == b.IsolationDomain &&
		ptr.Equal(a.ComputePercent, b.ComputePercent) &&
		(a.MemoryLimit == nil) == (b.MemoryLimit == nil) && (a.MemoryLimit == nil || a.MemoryLimit.Cmp(*b.MemoryLimit) == 0) &&
		equality.Semantic.DeepEqual(a.Placement, b.Placement)
}

func TestRequestConfigsMergeClassFirst(t *testing.T) {
	raw := func(params string) runtime.RawExtension {
		return runtime.RawExtension{Raw: []byte(`{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig"` + params + `}`)}
	}
	class := []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: raw(`,"mode":"mps","computePercent":5`)}}}}
	claim := []resourceapi.DeviceClaimConfiguration{
		{Requests: []string{"gpu"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: raw(`,"mode":"timeSlicing"`)}}},
		{Requests: []string{"other"}, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: raw(`,"computePercent":50`)}}},
	}
	cfgs := RequestConfigs(class, claim, "gpu/a")
	if len(cfgs) != 3 || cfgs[0].Source != resourceapi.AllocationConfigSourceClass || cfgs[0].Requests[0] != "gpu/a" {
		t.Fatalf("want the class's config for gpu/a, then the claim's two: %+v", cfgs)
	}
	got, err := MergeConfigs(DriverName, cfgs, "gpu/a")
	if err != nil {
		t.Fatal(err)
	}
	if !equalConfig(*got, GpuConfig{Mode: SharingModeTimeSlicing, ComputePercent: ptr.To[int32](5)}) {
		t.Fatalf("got %+v: want the claim's mode over the class's compute", *got)
	}
}
