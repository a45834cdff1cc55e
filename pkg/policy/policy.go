// Package policy resolves which SharingPolicy applies to a claim and turns it into the
// effective rules the allocator enforces, defaults filled in.
package policy

import (
	"fmt"
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
	Sizing                 api.SizingMode
	// IdleScaleDown is the policy's, defaults applied; nil: no workload is scaled down.
	IdleScaleDown *api.IdleScaleDown
	// Quota is the namespace's, from every policy that selects the namespace: not only
	// from this one, which pod labels may have chosen.
	Quota Quota
}

// Quota is what binds the claims of one namespace together. Every valid SharingPolicy
// whose namespaceSelector matches the namespace and that sets a quota binds it, whatever
// its podSelector: pod labels, which tenants write, may choose co-tenancy rules, never lift
// a quota. Where several set a limit, the smallest binds, per resource.
type Quota struct {
	Memory *resource.Quantity
	// MemoryFrom names the policy whose memory limit binds.
	MemoryFrom string
	Compute    *int64
	// ComputeFrom names the policy whose compute limit binds.
	ComputeFrom string
	// RefuseHeldRoom: the namespace may not keep free room from other namespaces on more
	// than one GPU (a policy's quota.heldRoom: Refuse), named by RefuseHeldRoomFrom.
	RefuseHeldRoom     bool
	RefuseHeldRoomFrom string
	// Invalid is set when a policy that sets a quota does not validate and may select the
	// namespace: its quota cannot be enforced, so the namespace's claims must wait.
	Invalid *InvalidQuota
}

// InvalidQuota is a policy with a quota that does not validate.
type InvalidQuota struct {
	Policy string
	Err    error
}

func (q *InvalidQuota) Error() string {
	return fmt.Sprintf("SharingPolicy %s is invalid: %v; its quota cannot be enforced, so claims it may bind wait until it is fixed", q.Policy, q.Err)
}

// Binds reports whether the namespace has a quota.
func (q Quota) Binds() bool { return q.Memory != nil || q.Compute != nil }

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
	return Effective{Isolation: api.IsolationNamespace, Latency: api.LatencyStandard, Mode: api.PolicyModeAuto, MaxCoTenants: 1, Sizing: api.SizingRecommend}
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
	if s.Sizing != "" {
		e.Sizing = s.Sizing
	}
	if s.DefaultCompute != nil {
		e.DefaultCompute = int64(*s.DefaultCompute)
	}
	if s.IdleScaleDown != nil {
		i := *s.IdleScaleDown
		i.Normalize()
		e.IdleScaleDown = &i
	}
	return e
}

// Resolve returns the policy that applies to a claim of a namespace with nsLabels whose pod
// has podLabels (nil when the claim has no pod yet: only policies without a podSelector
// match). The highest priority wins; equal priorities go to the alphabetically first name.
// A policy that does not validate (a bad selector, a negative quota) selects nothing: the
// allocator says so in an event when it reads one (pkg/controller, onPolicy). Nor does one
// that grants privileges to pods its podSelector alone selects (UnboundPrivileges): pod
// labels, which tenants write, choose only among what an administrator bound to the
// namespace, or what takes nothing from other namespaces. The quota is the namespace's
// (NamespaceQuota), whichever policy applies.
func Resolve(policies []*api.SharingPolicy, nsLabels, podLabels map[string]string) Effective {
	e := resolve(policies, nsLabels, podLabels)
	e.Quota = NamespaceQuota(policies, nsLabels)
	return e
}

func resolve(policies []*api.SharingPolicy, nsLabels, podLabels map[string]string) Effective {
	sorted := append([]*api.SharingPolicy(nil), policies...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].Spec.Priority != sorted[j].Spec.Priority {
			return sorted[i].Spec.Priority > sorted[j].Spec.Priority
		}
		return sorted[i].Name < sorted[j].Name
	})
	for _, p := range sorted {
		if p.DeletionTimestamp != nil || p.Spec.Validate() != nil || len(p.Spec.UnboundPrivileges()) > 0 {
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

// NamespaceQuota is the quota of a namespace with nsLabels: each limit is the smallest
// that a valid policy whose namespaceSelector matches sets (ties: the alphabetically first
// name). A policy that sets a quota but does not validate fails closed: if the namespace
// may be one it selects (every requirement of its namespaceSelector that can be evaluated
// matches), Invalid names it, the alphabetically first of such policies.
func NamespaceQuota(policies []*api.SharingPolicy, nsLabels map[string]string) Quota {
	sorted := append([]*api.SharingPolicy(nil), policies...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	var q Quota
	for _, p := range sorted {
		sq := p.Spec.Quota
		if p.DeletionTimestamp != nil || sq == nil || (sq.Memory == nil && sq.Compute == nil && sq.HeldRoom == "") {
			continue
		}
		if err := p.Spec.Validate(); err != nil {
			if q.Invalid == nil && mayMatch(p.Spec.NamespaceSelector, nsLabels) {
				q.Invalid = &InvalidQuota{Policy: p.Name, Err: err}
			}
			continue
		}
		if !matches(p.Spec.NamespaceSelector, nsLabels, true) {
			continue
		}
		if sq.Memory != nil && (q.Memory == nil || sq.Memory.Cmp(*q.Memory) < 0) {
			q.Memory, q.MemoryFrom = sq.Memory, p.Name
		}
		if sq.Compute != nil && (q.Compute == nil || *sq.Compute < *q.Compute) {
			q.Compute, q.ComputeFrom = sq.Compute, p.Name
		}
		if sq.HeldRoom == api.HeldRoomRefuse && !q.RefuseHeldRoom {
			q.RefuseHeldRoom, q.RefuseHeldRoomFrom = true, p.Name
		}
	}
	return q
}

// mayMatch reports whether a selector that may not parse can select set: false only when
// some part of it that can be evaluated does not match (a selector is a conjunction). A
// matchLabels entry is an equality, decidable whatever its key; a matchExpressions entry
// that does not parse may match.
func mayMatch(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return true
	}
	for k, v := range sel.MatchLabels {
		if got, ok := set[k]; !ok || got != v {
			return false
		}
	}
	for _, e := range sel.MatchExpressions {
		r, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{e}})
		if err == nil && !r.Matches(labels.Set(set)) {
			return false
		}
	}
	return true
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
