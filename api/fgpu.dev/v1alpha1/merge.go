package v1alpha1

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// MergeConfigs merges driver's opaque configs that apply to request: the class's first, then
// the claim's, later ones overriding earlier ones field by field. Every config that applies
// must decode strictly and validate. The result is not normalized, so that a caller can tell
// whether anyone set a field (the allocator keeps a mode the user chose).
func MergeConfigs(driver string, configs []resourceapi.DeviceAllocationConfiguration, request string) (*GpuConfig, error) {
	merged := &GpuConfig{}
	for _, source := range []resourceapi.AllocationConfigSource{resourceapi.AllocationConfigSourceClass, resourceapi.AllocationConfigSourceClaim} {
		for _, c := range configs {
			if c.Source != source || c.Opaque == nil || c.Opaque.Driver != driver || !AppliesTo(c.Requests, request) {
				continue
			}
			cfg, err := DecodeGpuConfig(c.Opaque.Parameters.Raw)
			if err != nil {
				return nil, err
			}
			if err := cfg.Validate(); err != nil {
				return nil, fmt.Errorf("invalid fgpu config: %w", err)
			}
			merged.Overlay(cfg)
		}
	}
	return merged, nil
}

// RequestConfigs lists the configs of a request before allocation, as kube-scheduler copies
// them into the allocation: the DeviceClass's (for this request), then the claim's.
func RequestConfigs(class []resourceapi.DeviceClassConfiguration, claim []resourceapi.DeviceClaimConfiguration, request string) []resourceapi.DeviceAllocationConfiguration {
	out := make([]resourceapi.DeviceAllocationConfiguration, 0, len(class)+len(claim))
	for _, c := range class {
		out = append(out, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClass, Requests: []string{request}, DeviceConfiguration: c.DeviceConfiguration})
	}
	for _, c := range claim {
		out = append(out, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: c.DeviceConfiguration})
	}
	return out
}
