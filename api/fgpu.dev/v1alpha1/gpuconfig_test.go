package v1alpha1

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestGpuConfigRoundTrip(t *testing.T) {
	in := GpuConfig{Mode: SharingModeTimeSlicing, MemoryLimit: ptr.To(resource.MustParse("8Gi")), ComputePercent: ptr.To[int32](30), IsolationDomain: "team-a"}
	in.APIVersion, in.Kind = SchemeGroupVersion.String(), GpuConfigKind
	raw, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeGpuConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	if out.Mode != in.Mode || out.MemoryLimit.Cmp(*in.MemoryLimit) != 0 || *out.ComputePercent != 30 || out.IsolationDomain != "team-a" {
		t.Fatalf("round trip changed the config: %+v", out)
	}
}

func TestDecodeGpuConfigRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ raw, want string }{
		"unknown field": {`{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig","memmory":"1Gi"}`, `unknown field "memmory"`},
		"wrong kind":    {`{"apiVersion":"fgpu.dev/v1alpha1","kind":"Other"}`, `kind GpuConfig`},
		"wrong version": {`{"apiVersion":"fgpu.dev/v9","kind":"GpuConfig"}`, `apiVersion fgpu.dev/v1alpha1`},
		"not json":      {`mode: mps`, `decode fgpu opaque config`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeGpuConfig([]byte(tc.raw))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
}

func TestGpuConfigValidate(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  GpuConfig
		want string
	}{
		"empty is valid":   {GpuConfig{}, ""},
		"unknown mode":     {GpuConfig{Mode: "vgpu"}, `unknown sharing mode "vgpu"`},
		"negative compute": {GpuConfig{ComputePercent: ptr.To[int32](-5)}, "computePercent -5 must be between 1 and 100"},
		"compute over 100": {GpuConfig{ComputePercent: ptr.To[int32](101)}, "between 1 and 100"},
		"zero memory":      {GpuConfig{MemoryLimit: ptr.To(resource.MustParse("0"))}, "memoryLimit 0 must be positive"},
		"bad domain":       {GpuConfig{IsolationDomain: "Team_A"}, "must be a DNS label"},
		"zero burst cap":   {GpuConfig{Placement: &Placement{MemoryLimit: ptr.To(resource.MustParse("0"))}}, "placement.memoryLimit 0 must be positive"},
		"burst cap":        {GpuConfig{Placement: &Placement{MemoryLimit: ptr.To(resource.MustParse("40Gi"))}}, ""},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}

func TestNormalizeDefaults(t *testing.T) {
	c := GpuConfig{}
	c.Normalize()
	if c.Mode != SharingModeMPS || c.IsolationDomain != DefaultIsolationDomain {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestOverlayAndAppliesTo(t *testing.T) {
	c := GpuConfig{Mode: SharingModeMPS, IsolationDomain: "a"}
	c.Overlay(&GpuConfig{ComputePercent: ptr.To[int32](10)})
	if c.Mode != SharingModeMPS || c.IsolationDomain != "a" || *c.ComputePercent != 10 {
		t.Fatalf("overlay of one field changed others: %+v", c)
	}
	c.Overlay(&GpuConfig{Mode: SharingModeTimeSlicing})
	if c.Mode != SharingModeTimeSlicing {
		t.Fatalf("overlay did not override mode: %+v", c)
	}
	for _, tc := range []struct {
		requests []string
		request  string
		want     bool
	}{
		{nil, "gpu", true},
		{[]string{"gpu"}, "gpu", true},
		{[]string{"gpu"}, "gpu/small", true},
		{[]string{"gpu/small"}, "gpu/large", false},
		{[]string{"other"}, "gpu", false},
	} {
		if got := AppliesTo(tc.requests, tc.request); got != tc.want {
			t.Errorf("AppliesTo(%v, %q) = %v", tc.requests, tc.request, got)
		}
	}
}
