package controller

import (
	"fmt"
	"sort"
	"strings"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// Event reasons.
const (
	ReasonPlaced      = "FgpuPlaced"
	ReasonWaiting     = "FgpuWaiting"
	ReasonOverQuota   = "FgpuOverQuota"
	ReasonQuotaQueued = "FgpuQuotaQueued"
	ReasonUnsupported = "FgpuUnsupported"
	ReasonTimedOut    = "FgpuAllocationTimedOut"
	ReasonDeallocated = "FgpuDeallocated"
	// ReasonMemoryNotEnforced is on a claim placed where its memory cap does not bind every
	// process of its pods, and on those pods.
	ReasonMemoryNotEnforced = "FgpuMemoryNotEnforced"
	// ReasonFinalizerRestored: someone removed the allocator's finalizer from a claim it
	// placed, and the allocator added it back.
	ReasonFinalizerRestored = "FgpuFinalizerRestored"
	// ReasonClaimDeletedInUse is on a pod whose claim was deleted while it ran on the
	// claim's GPU share: the share stays counted until the pod ends.
	ReasonClaimDeletedInUse = "FgpuClaimDeletedInUse"
	// ReasonPrepareRefused: the kubelet plugin refused to prepare the allocation (the GPU
	// is over-committed or gone); the allocator places the claim again.
	ReasonPrepareRefused = "FgpuPrepareRefused"
	// ReasonInvalidPolicy is on a SharingPolicy that does not validate.
	ReasonInvalidPolicy = "FgpuInvalidPolicy"
	// ReasonPodBoundElsewhere: pods that use one claim are bound to different nodes (their
	// spec.nodeName), so not all of them can use it. The claim waits, or, placed again after
	// a refused prepare, stays with the pods it is reserved for, and the others are told.
	ReasonPodBoundElsewhere = "FgpuPodBoundElsewhere"
	// ReasonSizingRecommendation: a workload's recommended size, from its claims' measured use,
	// appeared or moved (on the claim whose report moved it; api.AnnotationSizingRecord holds it).
	ReasonSizingRecommendation = "FgpuSizingRecommendation"
	// ReasonSized: a claim was placed at its workload's recommended size (sizing Initial).
	ReasonSized = "FgpuSized"
	// ReasonResizeEvicted: sizing Auto evicted a pod so that it comes back at a new size;
	// ReasonResizeBlocked: the eviction was refused (a PodDisruptionBudget), retried later;
	// ReasonResizeAtRequest: its use nears a cap that is all its claim asks.
	ReasonResizeEvicted   = "FgpuResizeEvicted"
	ReasonResizeBlocked   = "FgpuResizeBlocked"
	ReasonResizeAtRequest = "FgpuResizeAtRequest"
	// ReasonSelectorsTooCostly: the claim's CEL selectors cost more to evaluate than the
	// allocator spends on one claim; it is not placed.
	ReasonSelectorsTooCostly = "FgpuSelectorsTooCostly"
	// ReasonPreempted is on a pod the allocator deleted to take back a GPU its namespace
	// held beyond what its quota pays for, for a claim of another namespace (reclaim.go).
	ReasonPreempted = "FgpuPreempted"
)

// waitReason is why a claim is not placed now.
type waitReason struct {
	reason  string // event reason
	message string
	quota   bool // blocked on quota: later claims of the namespace queue behind it
	// beyondQuota: more than the whole quota, so no quota freed lets it in; it must not
	// hold the namespace's quota queue.
	beyondQuota bool
	// retryAfter > 0: look at the claim again after it (no capacity change is awaited);
	// quiet: so soon that there is nothing to tell the user.
	retryAfter time.Duration
	quiet      bool
	// constrained: a request its device constraints bind found no GPUs, which a claim
	// decided again with the constraint's value and node fixed may find (decide).
	constrained bool
	// reclaim: the claim would be placed on GPUs held on loan, were their shares gone
	// (reclaim.go); place takes them back.
	reclaim *reclamation
}

func (w *waitReason) Error() string { return w.message }

// rejects counts why GPUs were turned down, for the waiting message.
type rejects struct {
	counts  map[string]int
	example map[string]string
}

func (r *rejects) add(cat, example string) {
	if r.counts == nil {
		r.counts, r.example = map[string]int{}, map[string]string{}
	}
	r.counts[cat]++
	if _, ok := r.example[cat]; !ok && example != "" {
		r.example[cat] = example
	}
}

// onlyQuota reports whether every GPU turned down was turned down for quota, and some of
// them for what the namespace uses now, wherever the claim went. The room a namespace would
// keep on a new GPU does not count there: it depends on where the claim goes (a pod that
// fits only another node), and a younger claim that fits where the namespace keeps room
// already takes nothing the older one could have, so it must not wait behind it.
func (r *rejects) onlyQuota() bool {
	now := r.counts[reasonOverQuota]
	return now > 0 && now+r.counts[reasonOverQuotaHeld]+r.counts[reasonBeyondQuota] == r.total()
}

// onlyBeyondQuota reports whether every GPU turned down would have put the claim over the
// whole quota.
func (r *rejects) onlyBeyondQuota() bool {
	return len(r.counts) == 1 && r.counts[reasonBeyondQuota] > 0
}

func (r *rejects) total() int {
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

func (r *rejects) String() string {
	cats := make([]string, 0, len(r.counts))
	for k := range r.counts {
		cats = append(cats, k)
	}
	sort.Slice(cats, func(i, j int) bool {
		return r.counts[cats[i]] > r.counts[cats[j]] || (r.counts[cats[i]] == r.counts[cats[j]] && cats[i] < cats[j])
	})
	parts := make([]string, 0, len(cats))
	for _, k := range cats {
		p := fmt.Sprintf("%d GPU(s): %s", r.counts[k], k)
		if e := r.example[k]; e != "" {
			p += " (e.g. " + e + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// describe is the placement in words: "placed on node-1/gpu-3: 10Gi, 12% compute, MPS
// (domain a/default), 2 co-tenants".
func describe(d *decision) string {
	parts := make([]string, 0, len(d.results))
	for _, r := range d.results {
		s := fmt.Sprintf("placed on %s: ", r.gpu.Key())
		if r.whole {
			s += "whole GPU (" + fmtBytes(r.mem) + ")"
		} else {
			s += fmt.Sprintf("%s, %d%% compute, %s (domain %s), %d co-tenant(s)", fmtBytes(r.mem), r.comp, modeName(r.mode), r.domain, r.coTenants)
			if why := memoryNotEnforced(r, d.pol); why != "" && r.mode != api.SharingModeTimeSlicing {
				s += ", memory not enforced: " + why
			}
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + " [" + d.pol.DisplayName() + "]"
}

func modeName(m api.SharingMode) string {
	if m == api.SharingModeTimeSlicing {
		return "time-slicing (memory not enforced)"
	}
	return "MPS"
}

// memoryNotEnforced says why a result's memory cap does not bind every process of the claim,
// or "" where it does; the plugin tells the container the same (FGPU_MEMORY_ENFORCED,
// pkg/plugin memoryEnforcement). MPS caps bind MPS clients only: a process that bypasses
// the server is stopped only by the EXCLUSIVE_PROCESS compute mode, which a GPU keeps only
// while one MPS server owns it, so only where no other isolation domain may join.
func memoryNotEnforced(r result, pol policy.Effective) string {
	switch {
	case r.mode == api.SharingModeTimeSlicing:
		return "time-slicing: no memory cap"
	case r.whole || r.mem >= r.gpu.MemCap():
		return ""
	case pol.AllowSharedGPU:
		return fmt.Sprintf("MPS caps per process, and %s lets other isolation domains share the GPU with their own MPS servers, so a process that bypasses MPS is not capped", pol.DisplayName())
	}
	return ""
}

// notEnforcedMessage lists the results of a decision whose memory is not enforced, or "".
func notEnforcedMessage(d *decision) string {
	var parts []string
	for _, r := range d.results {
		if why := memoryNotEnforced(r, d.pol); why != "" {
			parts = append(parts, fmt.Sprintf("%s on %s: %s", r.request, r.gpu.Key(), why))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return "memory limit not enforced for every process: " + strings.Join(parts, "; ")
}
