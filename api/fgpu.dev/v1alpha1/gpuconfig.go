package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// GpuConfigKind is the kind of GpuConfig in opaque device configuration.
const GpuConfigKind = "GpuConfig"

// GpuConfig is the opaque configuration of an fgpu device request. Users may set it in a
// ResourceClaim's `config[].opaque.parameters`; the allocator writes it into the allocation.
// Every field is optional: the defaults come from the allocated consumed capacity.
type GpuConfig struct {
	metav1.TypeMeta `json:",inline"`

	// Mode is the sharing mode; default mps.
	Mode SharingMode `json:"mode,omitempty"`
	// MemoryLimit caps the device memory the claim's processes may pin. It may not exceed
	// the memory the claim was allocated; default: all of it.
	MemoryLimit *resource.Quantity `json:"memoryLimit,omitempty"`
	// ComputePercent caps the share of SMs (MPS active thread percentage), 1–100.
	// Default: the compute the claim was allocated, or no cap when it reserved none.
	ComputePercent *int32 `json:"computePercent,omitempty"`
	// IsolationDomain subdivides the claim's namespace: claims share an MPS server, its pipe
	// directory and shm only with claims of the same namespace and the same IsolationDomain.
	// It cannot name another namespace's domain. A DNS label; default: "default".
	IsolationDomain string `json:"isolationDomain,omitempty"`
	// Placement is written by the allocator only; see Placement.
	Placement *Placement `json:"placement,omitempty"`
}

// Placement is what the allocator decided for a request, beyond mode and domain. Only the
// allocator writes it, into the allocation in the claim's status, which tenants cannot
// write; the allocator refuses it in a claim's or a class's own config. The allocator reads
// it back when it rebuilds its state, so that a restart keeps the rules each claim was placed
// under; the plugin reads from it whether another isolation domain may share the GPU.
type Placement struct {
	// Policy names the SharingPolicy the claim was placed under ("" for the built-in default).
	Policy string `json:"policy,omitempty"`
	// LatencyClass, MaxCoTenants, AllowCriticalCoTenants and MaxTenantsPerGPU are the
	// co-tenancy rules the claim keeps on its GPU.
	LatencyClass           LatencyClass `json:"latencyClass,omitempty"`
	MaxCoTenants           int32        `json:"maxCoTenants,omitempty"`
	AllowCriticalCoTenants bool         `json:"allowCriticalCoTenants,omitempty"`
	MaxTenantsPerGPU       int32        `json:"maxTenantsPerGPU,omitempty"`
	// AllowSharedGPU says other isolation domains may share the GPU, each with its own MPS
	// server: the GPU then stays in the default compute mode, and a process that bypasses
	// MPS is not capped. Without it (in allocator mode) the kubelet plugin prepares no other
	// domain's share on the GPU, and this share on no GPU another domain uses.
	AllowSharedGPU bool `json:"allowSharedGPU,omitempty"`
	// MemoryLimit is the burst cap of a best-effort share placed under sizing Auto on a GPU
	// only its isolation domain uses: its processes may pin up to this much GPU memory, above
	// the memory allocated to it (its consumedCapacity memory, the guaranteed part that
	// packing and quota count). The guarantee holds only while the GPU's other tenants (all
	// of the same domain) stay within theirs. The kubelet plugin honours it only in
	// allocator mode, for an MPS share without allowSharedGPU or a memoryLimit of its own.
	MemoryLimit *resource.Quantity `json:"memoryLimit,omitempty"`
}

// DefaultIsolationDomain is the domain of claims that name none.
const DefaultIsolationDomain = "default"

// DecodeGpuConfig strictly decodes opaque parameters: unknown fields are errors, so that a
// typo in a claim fails loudly instead of being silently ignored.
func DecodeGpuConfig(raw []byte) (*GpuConfig, error) {
	var cfg GpuConfig
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("decode fgpu opaque config: %w", err)
	}
	if cfg.APIVersion != SchemeGroupVersion.String() || cfg.Kind != GpuConfigKind {
		return nil, fmt.Errorf("fgpu opaque config must be apiVersion %s, kind %s; got apiVersion %q, kind %q",
			SchemeGroupVersion, GpuConfigKind, cfg.APIVersion, cfg.Kind)
	}
	return &cfg, nil
}

// Validate checks the config on its own, without knowing the GPU or the allocation.
func (c *GpuConfig) Validate() error {
	switch c.Mode {
	case "", SharingModeMPS, SharingModeTimeSlicing:
	default:
		return fmt.Errorf("unknown sharing mode %q: must be %q or %q", c.Mode, SharingModeMPS, SharingModeTimeSlicing)
	}
	if c.MemoryLimit != nil && c.MemoryLimit.Sign() <= 0 {
		return fmt.Errorf("memoryLimit %s must be positive", c.MemoryLimit)
	}
	if c.ComputePercent != nil && (*c.ComputePercent < 1 || *c.ComputePercent > 100) {
		return fmt.Errorf("computePercent %d must be between 1 and 100", *c.ComputePercent)
	}
	if c.IsolationDomain != "" && len(validation.IsDNS1123Label(c.IsolationDomain)) > 0 {
		return fmt.Errorf("isolationDomain %q must be a DNS label (lowercase letters, digits, '-', at most 63)", c.IsolationDomain)
	}
	if c.Placement != nil && c.Placement.MemoryLimit != nil && c.Placement.MemoryLimit.Sign() <= 0 {
		return fmt.Errorf("placement.memoryLimit %s must be positive", c.Placement.MemoryLimit)
	}
	return nil
}

// Normalize fills the defaults that do not depend on the allocation.
func (c *GpuConfig) Normalize() {
	if c.Mode == "" {
		c.Mode = SharingModeMPS
	}
	if c.IsolationDomain == "" {
		c.IsolationDomain = DefaultIsolationDomain
	}
}

// Overlay sets the fields src sets: configs are applied class first, then claim, each
// overriding the earlier ones field by field.
func (c *GpuConfig) Overlay(src *GpuConfig) {
	if src.Mode != "" {
		c.Mode = src.Mode
	}
	if src.MemoryLimit != nil {
		c.MemoryLimit = src.MemoryLimit
	}
	if src.ComputePercent != nil {
		c.ComputePercent = src.ComputePercent
	}
	if src.IsolationDomain != "" {
		c.IsolationDomain = src.IsolationDomain
	}
	if src.Placement != nil {
		c.Placement = src.Placement
	}
}

// AppliesTo says whether a config that names requests (none: all of them) applies to a
// request, which may be a subrequest "parent/sub".
func AppliesTo(requests []string, request string) bool {
	if len(requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(request, "/")
	for _, r := range requests {
		if r == request || r == parent {
			return true
		}
	}
	return false
}
