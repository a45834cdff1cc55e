package v1alpha1

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// SharingPolicyKind and SharingPolicyResource name the SharingPolicy API.
const (
	SharingPolicyKind     = "SharingPolicy"
	SharingPolicyResource = "sharingpolicies"
)

// Isolation says which claims may share an MPS server or a GPU.
// +kubebuilder:validation:Enum=namespace;none;exclusive
type Isolation string

const (
	// IsolationNamespace: claims of different namespaces (or of different isolationDomains
	// of one namespace) never share an MPS server, and share a GPU only when AllowSharedGPU
	// is set.
	IsolationNamespace Isolation = "namespace"
	// IsolationNone lets claims of any namespace share a GPU, as AllowSharedGPU does; each
	// isolation domain (a namespace, or an isolationDomain within it) still gets its own MPS
	// server: no policy lets two namespaces share one.
	IsolationNone Isolation = "none"
	// IsolationExclusive never shares a GPU: each claim gets a whole GPU.
	IsolationExclusive Isolation = "exclusive"
)

// LatencyClass says how much co-tenancy a workload tolerates.
// +kubebuilder:validation:Enum=critical;standard;bestEffort
type LatencyClass string

const (
	// LatencyCritical: at most MaxCoTenants co-tenants, never another critical claim unless
	// AllowCriticalCoTenants, least-loaded GPUs first.
	LatencyCritical LatencyClass = "critical"
	// LatencyStandard: fragmentation-aware placement (the default).
	LatencyStandard LatencyClass = "standard"
	// LatencyBestEffort: packs tightly onto the fullest GPU that fits.
	LatencyBestEffort LatencyClass = "bestEffort"
)

// PolicyMode is the sharing mode a policy imposes; auto is the mode the claim asks for, and
// MPS when it names none: a claim is never time-sliced because of its GPU's other tenants.
// +kubebuilder:validation:Enum=mps;timeSlicing;auto
type PolicyMode string

const (
	PolicyModeMPS         PolicyMode = "mps"
	PolicyModeTimeSlicing PolicyMode = "timeSlicing"
	PolicyModeAuto        PolicyMode = "auto"
)

// SizingMode says what the allocator does with the sizes it recommends for a workload from
// its claims' measured use, named as Kubernetes' VPA names its update modes.
// +kubebuilder:validation:Enum=Off;Recommend;Initial;Auto
type SizingMode string

const (
	// SizingOff: nothing is told or changed.
	SizingOff SizingMode = "Off"
	// SizingRecommend: the recommendation is told (FgpuSizingRecommendation events, `fgpu
	// recommendations`); nothing is changed.
	SizingRecommend SizingMode = "Recommend"
	// SizingInitial: Recommend, and a new claim of the workload is placed at the recommended
	// memory and compute, never more than it asks; one that asks for no memory (a whole GPU)
	// at the recommended memory. Running pods keep their size: MPS fixes a process's caps
	// when it starts.
	SizingInitial SizingMode = "Initial"
	// SizingAuto: Initial, and a running pod whose measured use nears its memory cap, or
	// stays far below it for the history window, is evicted (Eviction API: PodDisruptionBudgets
	// hold) so that its controller recreates it at the new size; one pod of a workload at a
	// time, rate-limited. Nothing resizes a running process.
	SizingAuto SizingMode = "Auto"
)

// +genclient
// +genclient:nonNamespaced
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=sp
// +kubebuilder:printcolumn:name="Priority",type=integer,JSONPath=`.spec.priority`
// +kubebuilder:printcolumn:name="Isolation",type=string,JSONPath=`.spec.isolation`
// +kubebuilder:printcolumn:name="Latency",type=string,JSONPath=`.spec.latencyClass`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.mode`
// +kubebuilder:printcolumn:name="Accepted",type=string,JSONPath=`.status.conditions[?(@.type=="Accepted")].status`
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`

// SharingPolicy tells fgpu's allocator how the claims it selects share GPUs: who may share
// a GPU or an MPS server with whom, how many tenants a GPU takes, in which mode, how compute
// is sized and how much each namespace may hold. When several policies select a claim, the
// one with the highest priority wins (ties: the alphabetically first name); quotas are not
// chosen that way: see Quota.
type SharingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec SharingPolicySpec `json:"spec"`
	// Status is written by fgpu's allocator.
	// +optional
	Status SharingPolicyStatus `json:"status,omitempty"`
}

// SharingPolicyStatus says whether fgpu's allocator enforces the policy.
// +kubebuilder:object:generate=true
type SharingPolicyStatus struct {
	// Conditions: Accepted is True (reason Valid) when the allocator enforces the policy,
	// False (reason InvalidSelector or InvalidSpec, the error in the message) when it
	// ignores it; claims that its quota may bind then wait until it is fixed. False with
	// reason UnboundPrivileges: it grants privileges to pods its podSelector alone selects,
	// and applies to no pod until a namespaceSelector binds it.
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// The SharingPolicy status condition and its reasons.
const (
	ConditionAccepted     = "Accepted"
	ReasonValid           = "Valid"
	ReasonInvalidSelector = "InvalidSelector"
	ReasonInvalidSpec     = "InvalidSpec"
	// ReasonUnboundPrivileges: the policy grants privileges (Privileges) to pods that its
	// podSelector alone selects, so it applies to no pod.
	ReasonUnboundPrivileges = "UnboundPrivileges"
)

// SelectorError is Validate's error about a label selector.
type SelectorError struct {
	Field string // namespaceSelector or podSelector
	Err   error
}

func (e *SelectorError) Error() string { return e.Field + ": " + e.Err.Error() }
func (e *SelectorError) Unwrap() error { return e.Err }

// Accepted is the Accepted condition the policy's spec earns (LastTransitionTime unset).
func (p *SharingPolicy) Accepted() metav1.Condition {
	c := metav1.Condition{Type: ConditionAccepted, Status: metav1.ConditionTrue, Reason: ReasonValid,
		Message: "the allocator enforces this policy", ObservedGeneration: p.Generation}
	if err := p.Spec.Validate(); err != nil {
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ReasonInvalidSpec, err.Error()
		if se := (*SelectorError)(nil); errors.As(err, &se) {
			c.Reason = ReasonInvalidSelector
		}
		if p.Spec.Quota != nil {
			c.Message += "; the policy is ignored, and claims in the namespaces it may select wait until it is fixed (its quota cannot be enforced)"
		} else {
			c.Message += "; the policy is ignored until it is fixed"
		}
		return c
	}
	if priv := p.Spec.UnboundPrivileges(); len(priv) > 0 {
		c.Status, c.Reason = metav1.ConditionFalse, ReasonUnboundPrivileges
		c.Message = fmt.Sprintf("it grants %s to the pods its podSelector selects in any namespace, but tenants write their pods' labels: "+
			"a policy that grants more than the built-in default applies only in the namespaces its namespaceSelector selects, "+
			"so it applies to no pod; add a namespaceSelector that selects the namespaces it is for", strings.Join(priv, ", "))
		if p.Spec.Quota != nil {
			c.Message += " (its quota binds every namespace meanwhile)"
		}
	}
	return c
}

// Privileges are what the policy grants beyond the built-in default at the expense of other
// namespaces' claims: a GPU with fewer co-tenants (latencyClass critical, maxTenantsPerGPU,
// isolation exclusive) or a place on GPUs that other isolation domains use (isolation none,
// allowSharedGPU). A quota is no privilege: the smallest that selects a namespace binds.
func (s *SharingPolicySpec) Privileges() []string {
	var out []string
	if s.LatencyClass == LatencyCritical {
		out = append(out, "latencyClass critical")
	}
	if s.MaxTenantsPerGPU != nil {
		out = append(out, "maxTenantsPerGPU")
	}
	if s.Isolation == IsolationExclusive || s.Isolation == IsolationNone {
		out = append(out, "isolation "+string(s.Isolation))
	}
	if s.AllowSharedGPU {
		out = append(out, "allowSharedGPU")
	}
	return out
}

// UnboundPrivileges are the Privileges of a policy that pod labels alone select: a podSelector
// that selects by labels, and no namespaceSelector (or one that selects by nothing). Tenants
// write their pods' labels but not their namespace's, so such a policy would let any tenant
// choose its privileges; the allocator applies it to no pod.
func (s *SharingPolicySpec) UnboundPrivileges() []string {
	if selectsNothingBy(s.PodSelector) || !selectsNothingBy(s.NamespaceSelector) {
		return nil
	}
	return s.Privileges()
}

// selectsNothingBy reports whether a selector names no label: unset or empty, it selects
// every object.
func selectsNothingBy(sel *metav1.LabelSelector) bool {
	return sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0)
}

// SharingPolicySpec is the policy.
// +kubebuilder:object:generate=true
// +kubebuilder:validation:XValidation:rule="!has(self.maxCoTenants) || !has(self.latencyClass) || self.latencyClass == 'critical'",message="maxCoTenants applies only to latencyClass critical"
// +kubebuilder:validation:XValidation:rule="!has(self.allowSharedGPU) || !self.allowSharedGPU || !has(self.isolation) || self.isolation == 'namespace'",message="allowSharedGPU applies only to isolation namespace"
// +kubebuilder:validation:XValidation:rule="!has(self.isolation) || self.isolation != 'exclusive' || !has(self.maxTenantsPerGPU) || self.maxTenantsPerGPU == 1",message="isolation exclusive means one tenant per GPU: maxTenantsPerGPU must be 1 or unset"
// +kubebuilder:validation:XValidation:rule="!has(self.podSelector) || ((!has(self.podSelector.matchLabels) || size(self.podSelector.matchLabels) == 0) && (!has(self.podSelector.matchExpressions) || size(self.podSelector.matchExpressions) == 0)) || (has(self.namespaceSelector) && ((has(self.namespaceSelector.matchLabels) && size(self.namespaceSelector.matchLabels) > 0) || (has(self.namespaceSelector.matchExpressions) && size(self.namespaceSelector.matchExpressions) > 0))) || !((has(self.latencyClass) && self.latencyClass == 'critical') || has(self.maxTenantsPerGPU) || (has(self.isolation) && self.isolation != 'namespace') || (has(self.allowSharedGPU) && self.allowSharedGPU))",message="a policy that pods' labels alone select cannot grant latencyClass critical, maxTenantsPerGPU, isolation exclusive or none, or allowSharedGPU: tenants write their pods' labels; add a namespaceSelector that selects the namespaces it is for"
type SharingPolicySpec struct {
	// NamespaceSelector selects the namespaces of the claims this policy applies to; unset
	// selects every namespace.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: operators In and NotIn need values, Exists and DoesNotExist take none; there is no other operator"
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// PodSelector selects, by the labels of the claim's pod, the claims this policy applies
	// to; unset selects every pod. Tenants write their pods' labels: it chooses co-tenancy
	// rules, not the quota (see Quota), and a policy that grants privileges (latencyClass
	// critical, maxTenantsPerGPU, isolation exclusive or none, allowSharedGPU) needs a
	// namespaceSelector too, which only an administrator can satisfy (tenants cannot label
	// their namespace): pod labels choose among what their namespace was granted.
	// +kubebuilder:validation:XValidation:rule="!has(self.matchExpressions) || self.matchExpressions.all(e, e.operator in ['In', 'NotIn'] ? (has(e.values) && size(e.values) > 0) : (e.operator in ['Exists', 'DoesNotExist'] && (!has(e.values) || size(e.values) == 0)))",message="matchExpressions: operators In and NotIn need values, Exists and DoesNotExist take none; there is no other operator"
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`
	// Priority breaks ties between policies that select the same claim: highest wins.
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=-1000
	// +kubebuilder:validation:Maximum=1000
	// +optional
	Priority int32 `json:"priority,omitempty"`

	// Isolation: namespace (default), none or exclusive. An isolation domain is always a
	// namespace, or an isolationDomain a claim names within its namespace; claims share an
	// MPS server only within one domain, whatever the isolation.
	// +kubebuilder:default=namespace
	// +optional
	Isolation Isolation `json:"isolation,omitempty"`
	// AllowSharedGPU lets claims of different isolation domains share a GPU as separate MPS
	// servers (isolation namespace; isolation none implies it); default false: they never
	// share a GPU. Every claim on the GPU must allow it. The GPU then stays in the default
	// compute mode, so a process that bypasses MPS is not capped (FGPU_MEMORY_ENFORCED=false).
	// +optional
	AllowSharedGPU bool `json:"allowSharedGPU,omitempty"`

	// LatencyClass: critical, standard (default) or bestEffort.
	// +kubebuilder:default=standard
	// +optional
	LatencyClass LatencyClass `json:"latencyClass,omitempty"`
	// MaxCoTenants is the most other claims a critical claim's GPU may hold; default 1.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=64
	// +optional
	MaxCoTenants *int32 `json:"maxCoTenants,omitempty"`
	// AllowCriticalCoTenants lets two critical claims share a GPU.
	// +optional
	AllowCriticalCoTenants bool `json:"allowCriticalCoTenants,omitempty"`

	// MaxTenantsPerGPU caps the claims on any GPU that holds a claim of this policy.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=128
	// +optional
	MaxTenantsPerGPU *int32 `json:"maxTenantsPerGPU,omitempty"`

	// Mode: mps, timeSlicing or auto (default: the claim's own mode, else mps). A GPU's
	// tenants all share one mode.
	// +kubebuilder:default=auto
	// +optional
	Mode PolicyMode `json:"mode,omitempty"`

	// ComputeFromMemory sizes the compute of a claim that names none in proportion to its
	// memory: ceil(memory / GPU memory × 100) percent.
	// +optional
	ComputeFromMemory bool `json:"computeFromMemory,omitempty"`
	// DefaultCompute is the compute percent of a claim that names none (when
	// computeFromMemory is off); default 0: no reserved compute.
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100
	// +optional
	DefaultCompute *int32 `json:"defaultCompute,omitempty"`

	// Sizing is what the allocator does with the sizes it recommends for the workloads (a
	// Deployment, StatefulSet, CronJob, Job or bare pod, and the claim's request) of the pods
	// this policy applies to, from their claims' measured use: Off, Recommend (the default:
	// recommendations are told from the first minute, nothing is changed), Initial or Auto.
	// Pod labels choose the policy, so a tenant can choose its own workloads' mode; a workload
	// is only ever sized from its own pods' use.
	// +kubebuilder:default=Recommend
	// +optional
	Sizing SizingMode `json:"sizing,omitempty"`

	// Quota caps what the claims of each namespace that namespaceSelector selects hold
	// together, whole GPUs included. It binds every claim of such a namespace, whatever
	// podSelector says and whichever policy applies to the claim otherwise: pod labels,
	// which tenants write, choose co-tenancy rules, never lift a quota. Where several
	// policies set a quota for a namespace, each limit holds (the smallest binds, per
	// resource). A claim over quota waits (in creation order) until quota frees up; a claim
	// larger than the whole quota is refused and holds no other claim. A policy with a
	// quota that does not validate (stored before the schema refused it) holds the claims
	// of every namespace it may select until it is fixed.
	// +optional
	Quota *Quota `json:"quota,omitempty"`

	// IdleScaleDown lets the allocator scale to zero the Deployments and StatefulSets of
	// the pods this policy applies to whose GPU use stays idle for IdleScaleDown.After,
	// when their owner opted in with the annotation fgpu.dev/idle-scale-down: "true" on the
	// workload. Their quota stays theirs while they are scaled down; `fgpu wake` (or KEDA,
	// or kubectl scale) brings them back. Unset: no workload is scaled.
	// +optional
	IdleScaleDown *IdleScaleDown `json:"idleScaleDown,omitempty"`
}

// MinIdleScaleDownAfter is the least IdleScaleDown.After. Idleness is judged on the kubelet
// plugin's usage reports, which must cover After without a break, so the real granularity
// is the plugin's report interval and heartbeat (5m and 30m by default), not this bound.
const MinIdleScaleDownAfter = time.Minute

// DefaultSMBelowPercent is IdleScaleDown.SMBelowPercent when unset: no SM activity at all.
const DefaultSMBelowPercent = 1

// IdleScaleDown says when a workload counts as idle.
// +kubebuilder:object:generate=true
type IdleScaleDown struct {
	// After is how long every claim of the workload must have been idle: at least 1m.
	// Idleness is judged on the kubelet plugin's usage reports (every reportInterval
	// while use moves, else every heartbeat: 5m and 30m by default), which must cover
	// After without a break: a workload is scaled up to one report late, and an After
	// shorter than two report intervals is judged on one or two reports.
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1m')",message="after must be at least 1m"
	After metav1.Duration `json:"after"`
	// SMBelowPercent: a claim is idle while the highest SM activity of each of its usage
	// reports is below this percent (reports without SM samples never count as idle).
	// Memory is not looked at: an idle inference server keeps its model loaded.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=100
	// +optional
	SMBelowPercent int32 `json:"smBelowPercent,omitempty"`
}

// Normalize fills in the defaults the CRD's schema applies, for policies stored before it did.
func (i *IdleScaleDown) Normalize() {
	if i.SMBelowPercent == 0 {
		i.SMBelowPercent = DefaultSMBelowPercent
	}
}

// Validate says what is wrong with the bounds.
func (i *IdleScaleDown) Validate() error {
	if i.After.Duration < MinIdleScaleDownAfter {
		return fmt.Errorf("idleScaleDown.after %s must be at least %s", i.After.Duration, MinIdleScaleDownAfter)
	}
	if i.SMBelowPercent < 1 || i.SMBelowPercent > 100 {
		return fmt.Errorf("idleScaleDown.smBelowPercent %d must be between 1 and 100", i.SMBelowPercent)
	}
	return nil
}

// Validate says what is wrong with a policy that the CRD's schema cannot refuse (label keys
// and values that are not: rules that check them exceed the CRD's CEL cost budget, since
// metav1.LabelSelector bounds none of its lists and strings), or that was stored before the
// schema refused it (a negative quota, an operator In or NotIn without values, Exists or
// DoesNotExist with values). It is the authoritative check; the allocator applies it.
func (s *SharingPolicySpec) Validate() error {
	if err := validateSelector(s.NamespaceSelector); err != nil {
		return &SelectorError{Field: "namespaceSelector", Err: err}
	}
	if err := validateSelector(s.PodSelector); err != nil {
		return &SelectorError{Field: "podSelector", Err: err}
	}
	if q := s.Quota; q != nil {
		if q.Memory != nil && q.Memory.Sign() < 0 {
			return fmt.Errorf("quota.memory %s must not be negative", q.Memory)
		}
		if q.Compute != nil && *q.Compute < 0 {
			return fmt.Errorf("quota.compute %d must not be negative", *q.Compute)
		}
		if q.HeldRoom != "" && q.HeldRoom != HeldRoomCharge && q.HeldRoom != HeldRoomRefuse {
			return fmt.Errorf("quota.heldRoom %q must be %q or %q", q.HeldRoom, HeldRoomCharge, HeldRoomRefuse)
		}
	}
	if s.IdleScaleDown != nil {
		i := *s.IdleScaleDown
		i.Normalize()
		if err := i.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// validateSelector is metav1.LabelSelectorAsSelector's check with matchLabels checked in
// key order first: that function walks the map in Go's random order, so with several bad
// labels the error named one at random, and the policy's status (written when its message
// changes) flapped.
func validateSelector(ls *metav1.LabelSelector) error {
	if ls != nil {
		for _, k := range slices.Sorted(maps.Keys(ls.MatchLabels)) {
			if _, err := labels.NewRequirement(k, selection.Equals, []string{ls.MatchLabels[k]}); err != nil {
				return err
			}
		}
	}
	_, err := metav1.LabelSelectorAsSelector(ls)
	return err
}

// Quota is a per-namespace cap on allocated GPU memory and compute.
// +kubebuilder:object:generate=true
// +kubebuilder:validation:XValidation:rule="has(self.memory) || has(self.compute) || has(self.heldRoom)",message="a quota caps memory, compute or both, or sets heldRoom"
type Quota struct {
	// Memory is the GPU memory the namespace's claims may hold together.
	// +kubebuilder:validation:XValidation:rule="!quantity(string(self)).isLessThan(quantity('0'))",message="memory must not be negative"
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// Compute is the compute percent (100 = one whole GPU) the namespace's claims may hold.
	// +kubebuilder:validation:Minimum=0
	// +optional
	Compute *int64 `json:"compute,omitempty"`
	// HeldRoom is what the free room the namespace's claims keep from other namespaces
	// costs it (an isolation domain, time-slicing, a whole GPU, a burst or a co-tenant
	// limit keeps a GPU's room to the namespace). Charge (the default): the room of every
	// GPU it keeps but its roomiest counts against Memory and Compute. Refuse: the namespace
	// may keep room on one GPU only; a placement that would keep room on another is not
	// made, and the claim waits for a GPU where it keeps nothing more. Use Refuse where
	// Kueue owns the namespace's quota: Kueue charges what the claims ask, and under Refuse
	// that is what the namespace holds, but for one GPU's room.
	// +optional
	HeldRoom HeldRoomRule `json:"heldRoom,omitempty"`
}

// HeldRoomRule is what a quota does with the free room a namespace keeps from others.
// +kubebuilder:validation:Enum=Charge;Refuse
type HeldRoomRule string

const (
	// HeldRoomCharge counts the room kept on every GPU but the roomiest against the quota.
	HeldRoomCharge HeldRoomRule = "Charge"
	// HeldRoomRefuse never lets the namespace keep room on more than one GPU.
	HeldRoomRefuse HeldRoomRule = "Refuse"
)

// +kubebuilder:object:root=true

// SharingPolicyList is a list of SharingPolicies.
type SharingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SharingPolicy `json:"items"`
}

// IdleReserve is the quota a workload scaled to zero keeps.
type IdleReserve struct {
	Memory  resource.Quantity `json:"memory"`
	Compute int64             `json:"compute"`
}
