package v1alpha1

import (
	"bytes"
	"encoding/json"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// FuzzDecodeGpuConfig feeds the opaque parameters a tenant writes into a claim to the
// decoder the allocator and the plugin run. A config either fails to decode or validate,
// or it survives a re-encode unchanged, and normalizing it keeps it valid.
func FuzzDecodeGpuConfig(f *testing.F) {
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := DecodeGpuConfig(raw)
		if err != nil {
			return
		}
		if cfg.APIVersion != SchemeGroupVersion.String() || cfg.Kind != GpuConfigKind {
			t.Fatalf("decoded a config of %s %s", cfg.APIVersion, cfg.Kind)
		}
		if cfg.Validate() != nil {
			return
		}
		again := reencode(t, cfg)
		if a, b := mustJSON(t, cfg), mustJSON(t, again); !bytes.Equal(a, b) {
			t.Fatalf("re-encoding changed a valid config:\n%s\n%s", a, b)
		}
		if err := again.Validate(); err != nil {
			t.Fatalf("a valid config no longer validates after a re-encode: %v\n%s", err, mustJSON(t, cfg))
		}
		again.Normalize()
		if err := again.Validate(); err != nil {
			t.Fatalf("normalizing made a valid config invalid: %v", err)
		}
		if again.Mode == "" || again.IsolationDomain == "" {
			t.Fatalf("normalize left defaults unset: %+v", again)
		}
	})
}

// FuzzMergeConfigs merges a class's and a claim's config in either order in the list: the
// merge fails exactly when one of them is invalid, and otherwise the claim's fields win
// over the class's, whatever the order the configs are listed in.
func FuzzMergeConfigs(f *testing.F) {
	f.Fuzz(func(t *testing.T, classRaw, claimRaw []byte, claimFirst bool) {
		opaque := func(source resourceapi.AllocationConfigSource, raw []byte) resourceapi.DeviceAllocationConfiguration {
			return resourceapi.DeviceAllocationConfiguration{Source: source, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: DriverName, Parameters: runtime.RawExtension{Raw: raw}}}}
		}
		configs := []resourceapi.DeviceAllocationConfiguration{
			opaque(resourceapi.AllocationConfigSourceClass, classRaw),
			opaque(resourceapi.AllocationConfigSourceClaim, claimRaw),
			// Another driver's config is never read, whatever it holds.
			{Source: resourceapi.AllocationConfigSourceClaim, DeviceConfiguration: resourceapi.DeviceConfiguration{
				Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "other.example.com", Parameters: runtime.RawExtension{Raw: []byte("not json")}}}},
		}
		if claimFirst {
			configs[0], configs[1] = configs[1], configs[0]
		}
		merged, err := MergeConfigs(DriverName, configs, "gpu")
		class, classErr := decodeValid(classRaw)
		claim, claimErr := decodeValid(claimRaw)
		if (classErr != nil || claimErr != nil) != (err != nil) {
			t.Fatalf("merge error %v, but class config error %v and claim config error %v", err, classErr, claimErr)
		}
		if err != nil {
			return
		}
		want := &GpuConfig{}
		want.Overlay(class)
		want.Overlay(claim)
		if a, b := mustJSON(t, merged), mustJSON(t, want); !bytes.Equal(a, b) {
			t.Fatalf("merged %s, want class then claim: %s", a, b)
		}
		if err := merged.Validate(); err != nil {
			t.Fatalf("merging two valid configs gave an invalid one: %v", err)
		}
	})
}

func decodeValid(raw []byte) (*GpuConfig, error) {
	cfg, err := DecodeGpuConfig(raw)
	if err != nil {
		return nil, err
	}
	return cfg, cfg.Validate()
}

func reencode(t *testing.T, cfg *GpuConfig) *GpuConfig {
	t.Helper()
	again, err := DecodeGpuConfig(mustJSON(t, cfg))
	if err != nil {
		t.Fatalf("a valid config does not decode after a re-encode: %v\n%s", err, mustJSON(t, cfg))
	}
	return again
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
