package plugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

var (
	keepGPU   = map[string]any{"placement": map[string]any{}}
	shareGPU  = map[string]any{"placement": map[string]any{"allowSharedGPU": true}}
	sliceKeep = map[string]any{"mode": "timeSlicing", "placement": map[string]any{}}
)

// The plugin keeps the promise FGPU_MEMORY_ENFORCED=true makes, whoever wrote the allocation
// (a deposed allocator, a lagging informer): no second isolation domain, MPS or time-sliced,
// joins a GPU where the new claim's or a prepared claim's placement keeps it to one domain.
// The refusal is one the allocator acts on.
func TestSecondDomainRefusedNextToAnEnforcedShare(t *testing.T) {
	for name, tc := range map[string]struct {
		first, second map[string]any
		secondNS      string
		refused       bool
	}{
		"another domain that may share, next to one that keeps the GPU": {keepGPU, shareGPU, "attacker", true},
		"a claim that keeps the GPU, next to another domain":            {shareGPU, keepGPU, "attacker", true},
		"a time-sliced claim next to one that keeps the GPU":            {keepGPU, map[string]any{"mode": "timeSlicing", "placement": map[string]any{"allowSharedGPU": true}}, "attacker", true},
		"an MPS claim that keeps the GPU, next to a time-sliced one":    {sliceKeep, keepGPU, "victim", true},
		"a sub-domain of the same namespace":                            {keepGPU, map[string]any{"isolationDomain": "other", "placement": map[string]any{}}, "victim", true},
		"the same domain":                                               {keepGPU, keepGPU, "victim", false},
		"two domains whose placements both allow sharing":               {shareGPU, shareGPU, "attacker", false},
		"a claim of an older allocator (no placement) next to sharing":  {shareGPU, nil, "attacker", false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Fenced = true
			s := e.state()
			ctx := context.Background()
			victim := builders.MakeClaim("victim", "v").Memory("10Gi").Config(tc.first).AllocatedOn(node, "gpu-0").Obj()
			if _, err := s.Prepare(ctx, victim); err != nil {
				t.Fatal(err)
			}
			before, modeBefore := e.specEnv(string(victim.UID)), computeMode(t, s, "gpu-0")
			b := builders.MakeClaim(tc.secondNS, "second").Memory("10Gi")
			if tc.second != nil {
				b.Config(tc.second)
			}
			second := b.AllocatedOn(node, "gpu-0").Obj()
			_, err := s.Prepare(ctx, second)
			if !tc.refused {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var rf *refusal
			if !errors.As(err, &rf) || rf.reason != configapi.PrepareReasonIsolationConflict || rf.device != "gpu-0" ||
				rf.shareID != string(*second.Status.Allocation.Devices.Results[0].ShareID) ||
				!strings.Contains(err.Error(), "refusing to put a second isolation domain on GPU gpu-0") || strings.Contains(err.Error(), "victim/v") {
				t.Fatalf("want an IsolationConflict refusal that names no other claim, got %v", err)
			}
			if m := computeMode(t, s, "gpu-0"); m != modeBefore {
				t.Errorf("compute mode went from %s to %s", modeBefore, m)
			}
			if after := e.specEnv(string(victim.UID)); !slices.Equal(before, after) {
				t.Errorf("victim's env changed: %v", after)
			}
			if _, ok := s.PreparedClaims()[string(second.UID)]; ok || e.specCount() != 1 {
				t.Errorf("the refused claim left an entry or a spec (%d specs)", e.specCount())
			}
		})
	}
}

// Shares of two domains that may share a GPU put it in the default compute mode, and neither
// is told its memory is enforced.
func TestSharedGPUDomainsAreToldTheTruth(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	for _, ns := range []string{"a", "b"} {
		c := builders.MakeClaim(ns, "c").Memory("10Gi").Config(shareGPU).AllocatedOn(node, "gpu-0").Obj()
		if _, err := s.Prepare(ctx, c); err != nil {
			t.Fatal(err)
		}
		if env := e.specEnv(string(c.UID)); !slices.Contains(env, "FGPU_MEMORY_ENFORCED=false") {
			t.Errorf("%s: %v", ns, env)
		}
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("compute mode %s", m)
	}
}

// In scheduler mode kube-scheduler may put an MPS and a time-sliced claim on one GPU. The GPU
// must then stay in the default compute mode (EXCLUSIVE_PROCESS would let the MPS server
// alone open it and the time-sliced pod fail), and the MPS share is not told it is enforced.
func TestSchedulerModeMixesMPSAndTimeSlicing(t *testing.T) {
	for name, mpsFirst := range map[string]bool{"mps first": true, "time-sliced first": false} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			s := e.state()
			ctx := context.Background()
			mpsClaim := builders.MakeClaim("a", "mps").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
			sliced := builders.MakeClaim("b", "sliced").Memory("10Gi").Config(map[string]any{"mode": "timeSlicing"}).AllocatedOn(node, "gpu-0").Obj()
			order := []string{"mps", "sliced"}
			if !mpsFirst {
				order = []string{"sliced", "mps"}
			}
			for _, n := range order {
				claim := mpsClaim
				if n == "sliced" {
					claim = sliced
				}
				if _, err := s.Prepare(ctx, claim); err != nil {
					t.Fatalf("prepare %s: %v", n, err)
				}
			}
			if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
				t.Fatalf("an MPS and a time-sliced claim on one GPU need the default compute mode, got %s", m)
			}
			if env := e.specEnv(string(mpsClaim.UID)); !slices.Contains(env, "FGPU_MEMORY_ENFORCED=false") {
				t.Errorf("MPS share env %v", env)
			}
			if err := s.Unprepare(ctx, string(sliced.UID)); err != nil {
				t.Fatal(err)
			}
			if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeExclusiveProcess {
				t.Fatalf("the MPS server alone again: compute mode %s", m)
			}
		})
	}
}

// The allocator frees a share once its pod is done, which can come a moment before the kubelet
// unprepares the claim; a claim of another domain placed there then was refused, and its pod
// waited for the allocator's bind timeout and the kubelet's retry (a flaky e2e test showed it).
// A prepare that claims whose pods are gone refuse waits for them to be unprepared; one that
// claims of running pods refuse is refused at once.
func TestPrepareWaitsForAClaimWhosePodIsGone(t *testing.T) {
	for name, tc := range map[string]struct {
		pod     *corev1.Pod // the first claim's pod as the node's pod watch shows it (nil: gone)
		refused bool
	}{
		"its pod is gone":      {nil, false},
		"its pod is deleted":   {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "v", UID: "pod-v", DeletionTimestamp: &metav1.Time{}}}, false},
		"its pod still runs":   {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "v", UID: "pod-v"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}, true},
		"a new pod, same name": {&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "victim", Name: "v", UID: "pod-v2"}, Status: corev1.PodStatus{Phase: corev1.PodRunning}}, false},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Fenced = true
			s := e.state()
			ctx := context.Background()
			pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
			if tc.pod != nil {
				if err := pods.Add(tc.pod); err != nil {
					t.Fatal(err)
				}
			}
			s.usePodWatch(corelisters.NewPodLister(pods))
			first := builders.MakeClaim("victim", "v").Memory("10Gi").Config(keepGPU).AllocatedOn(node, "gpu-0").Obj()
			if _, err := s.PrepareFor(ctx, first, []checkpoint.PodRef{{UID: "pod-v", Name: "v"}}); err != nil {
				t.Fatal(err)
			}
			go func() {
				time.Sleep(300 * time.Millisecond)
				_ = s.Unprepare(ctx, string(first.UID)) // the kubelet, for a pod that is done
			}()
			second := builders.MakeClaim("other", "o").Memory("10Gi").Config(keepGPU).AllocatedOn(node, "gpu-0").Obj()
			start := time.Now()
			_, err := s.PrepareFor(ctx, second, []checkpoint.PodRef{{UID: "pod-o", Name: "o"}})
			took := time.Since(start)
			switch {
			case tc.refused && err == nil:
				t.Fatal("prepared next to a claim whose pod still runs")
			case tc.refused && took > time.Second:
				t.Errorf("refused after %s; a running pod's claim is no reason to wait", took)
			case !tc.refused && err != nil:
				t.Fatalf("refused after %s though the other claim's pod is gone: %v", took, err)
			}
		})
	}
}
