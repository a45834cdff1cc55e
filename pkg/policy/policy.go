// Package policy resolves which SharingPolicy applies to a claim and turns it into the
// effective rules the allocator enforces, defaults filled in.
package policy

import (
	"sort"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Effective is a policy with every default applied.
type Effective struct {
	// Name is the SharingPolicy's name, or "" for the built-in default.
	Name      string
	Isolation api.Isolation
	// AllowSharedGPU: other isolation domains may share the claim's GPU (the spec's
	// allowSharedGPU, or isolation none).
	AllowSharedGPU         bool
	Latency                api.LatencyClass
	MaxCoTenants           int // critical only
	AllowCriticalCoTenants bool
	MaxTenants             int // 0: no cap
	Mode                   api.PolicyMode
	ComputeFromMemory      bool
	DefaultCompute         int64
	QuotaMemory            *resource.Quantity
	QuotaCompute           *int64
}

// DisplayName names the policy in messages.
func (e Effective) DisplayName() string {
	if e.Name == "" {
		return "built-in default"
	}
	return "SharingPolicy " + e.Name
}

// Default is what applies when no SharingPolicy selects a claim: namespaces isolated,
// standard latency, mode auto, no quota.
func Default() Effective {
	return Effective{Isolation: api.IsolationNamespace, Latency: api.LatencyStandard, Mode: api.PolicyModeAuto, MaxCoTenants: 1}
}

// FromSpec applies defaults to a policy's spec.
func FromSpec(name string, s *api.SharingPolicySpec) Effective {
	e := Default()
	e.Name = name
	if s.Isolation != "" {
		e.Isolation = s.Isolation
	}
	// Isolation none lets any namespace share a GPU; each domain still gets its own MPS
	// server (a domain is always within one namespace).
	e.AllowSharedGPU = s.AllowSharedGPU || e.Isolation == api.IsolationNone
	if s.LatencyClass != "" {
		e.Latency = s.LatencyClass
	}
	if s.MaxCoTenants != nil {
		e.MaxCoTenants = int(*s.MaxCoTenants)
	}
	e.AllowCriticalCoTenants = s.AllowCriticalCoTenants
	if s.MaxTenantsPerGPU != nil {
		e.MaxTenants = int(*s.MaxTenantsPerGPU)
	}
	if e.Isolation == api.IsolationExclusive {
		e.MaxTenants = 1
	}
	if s.Mode != "" {
		e.Mode = s.Mode
	}
	e.ComputeFromMemory = s.ComputeFromMemory
	if s.DefaultCompute != nil {
		e.DefaultCompute = int64(*s.DefaultCompute)
	}
	if s.Quota != nil {
		e.QuotaMemory = s.Quota.Memory
		e.QuotaCompute = s.Quota.Compute
	}
	return e
}

// Resolve returns the policy that applies to a claim of a namespace with nsLabels whose pod
// has podLabels (nil when the claim has no pod yet: only policies without a podSelector
// match). The highest priority wins; equal priorities go to the alphabetically first name.
// A policy that does not validate (a bad selector, a negative quota) selects nothing: the
// allocator says so in an event when it reads one (pkg/controller, onPolicy).
func Resolve(policies []*api.SharingPolicy, nsLabels, podLabels map[string]string) Effective {
	sorted := append([]*api.SharingPolicy(nil), policies...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Spec.Priority != sorted[j].Spec.Priority {
			return sorted[i].Spec.Priority > sorted[j].Spec.Priority
		}
		return sorted[i].Name < sorted[j].Name
	})
	for _, p := range sorted {
		if p.DeletionTimestamp != nil || p.Spec.Validate() != nil {
			continue
		}
		if !matches(p.Spec.NamespaceSelector, nsLabels, true) {
			continue
		}
		if !matches(p.Spec.PodSelector, podLabels, podLabels != nil) {
			continue
		}
		return FromSpec(p.Name, &p.Spec)
	}
	return Default()
}

func matches(sel *metav1.LabelSelector, set map[string]string, known bool) bool {
	if sel == nil {
		return true
	}
	if !known {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(set))
}
