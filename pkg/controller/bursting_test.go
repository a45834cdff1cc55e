package controller

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

var burstT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// templatePod is a pod of Deployment dep (through a ReplicaSet) with its own claim, which
// asks for asked (a whole GPU when ""), as a ResourceClaimTemplate makes it.
func templatePod(dep, name, asked string) (*resourceapi.ResourceClaim, *corev1.Pod) {
	p := ownedPod("team-a", name, "ReplicaSet", dep+"-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	p.UID = types.UID("uid-" + name)
	p.Spec.NodeName = ""
	b := builders.MakeClaim("team-a", name+"-gpu")
	if asked != "" {
		b = b.Memory(asked)
	}
	claim := b.Obj()
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
	return claim, p
}

// placedTemplatePod is templatePod already placed on n1's device whole.
func placedTemplatePod(dep, name, device string) (*resourceapi.ResourceClaim, *corev1.Pod) {
	claim, p := templatePod(dep, name, "")
	claim.Status = builders.MakeClaim("team-a", claim.Name).AllocatedOn("n1", device).Obj().Status
	claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory] = resource.MustParse("80Gi")
	p.Spec.NodeName = "n1"
	return claim, p
}

// burstEnv: namespace team-a's best-effort pods under sizing Auto on n1's GPUs of 80Gi.
func newBurstEnv(t *testing.T, gpus int, objs ...runtime.Object) *env {
	objs = append(objs, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", gpus, "80Gi"))
	return newEnvWith(t, func(c *Config) {
		c.Sizing = sizing.DefaultOptions()
		c.Sizing.MinSamples = 90
		c.SizingShrinkAfter = 24 * time.Hour
	}, []*api.SharingPolicy{builders.MakePolicy("auto").Sizing(api.SizingAuto).Latency(api.LatencyBestEffort).Obj()}, objs...)
}

// reportPeaks writes the claim's usage summaries, one per 5-minute interval from interval
// first on, with these peaks (GiB), and sets the clock to the end of the last.
func reportPeaks(e *env, claimName string, first int, peaks ...int64) {
	e.t.Helper()
	for j, p := range peaks {
		i := first + j
		cur := e.claim("team-a", claimName)
		cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(e.t, cur, string(*cur.Status.Allocation.Devices.Results[0].ShareID), api.ShareUsage{
			From: burstT0.Add(time.Duration(i)*5*time.Minute + time.Second), To: burstT0.Add(time.Duration(i+1)*5*time.Minute - time.Second), Samples: 30,
			MemoryMaxBytes: p << 30, SMSamples: 30, SMP95Percent: 15})}
		if _, err := e.client.ResourceV1().ResourceClaims("team-a").UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			e.t.Fatal(err)
		}
		e.settle()
	}
	e.clock.SetTime(burstT0.Add(time.Duration(first+len(peaks))*5*time.Minute - time.Second))
}

// burstOf is a claim's one result and the burst cap its placement carries (0: none).
func burstOf(t *testing.T, e *env, name string) (resourceapi.DeviceRequestAllocationResult, int64) {
	t.Helper()
	c := e.claim("team-a", name)
	if c.Status.Allocation == nil {
		t.Fatalf("claim %s not allocated: %v; events %q", name, c.Annotations, e.events(""))
	}
	r := c.Status.Allocation.Devices.Results[0]
	pl := model.AllocationConfig(api.DriverName, c.Status.Allocation.Devices.Config, r.Request).Placement
	if pl == nil || pl.MemoryLimit == nil {
		return r, 0
	}
	return r, pl.MemoryLimit.Value()
}

// Two workloads whose peaks (35Gi) never coincide: their new pods burst, each guaranteed its
// typical use and capped at twice its peak (70Gi: together far more than the GPU), and share
// the one free GPU; a third pod, whose workload's peaks would coincide with one of theirs, is
// refused there and says why.
func TestBurstingSharesShareAGPUTheirPeaksCouldNot(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	batch, batchPod := placedTemplatePod("batch", "batch-7c9d5-a", "gpu-1")
	e := newBurstEnv(t, 3, web, webPod, batch, batchPod)
	reportPeaks(e, web.Name, 0, 35, 35, 35, 35, 35, 35, 5, 5, 5, 5, 5, 5)
	reportPeaks(e, batch.Name, 0, 5, 5, 5, 5, 5, 5, 35, 35, 35, 35, 35, 35)
	web2, web2Pod := templatePod("web", "web-7c9d5-b", "")
	batch2, batch2Pod := templatePod("batch", "batch-7c9d5-b", "")
	e.create(web2, web2Pod)
	e.run()
	e.create(batch2, batch2Pod)
	e.run()
	for _, name := range []string{web2.Name, batch2.Name} {
		r, capBytes := burstOf(t, e, name)
		mem := r.ConsumedCapacity[api.CapacityMemory]
		if r.Device != "gpu-2" || capBytes != 70<<30 || mem.Value() >= capBytes || mem.Value() < 5<<30 {
			t.Errorf("claim %s on %s consumes %s, capped at %s; want gpu-2, capped at 70Gi above a guaranteed part of at least 5Gi", name, r.Device, mem.String(), fmtBytes(capBytes))
		}
	}
	if ev := e.events("may burst"); len(ev) == 0 {
		t.Errorf("no event tells the claim it may burst: %q", e.events(""))
	}
	e.checkInvariant()
	web3, web3Pod := templatePod("web", "web-7c9d5-c", "")
	e.create(web3, web3Pod)
	e.run()
	if c := e.claim("team-a", web3.Name); c.Status.Allocation != nil {
		t.Fatalf("a third bursting share was placed on %s: web's peaks twice and batch's lows need more than the GPU admits", c.Status.Allocation.Devices.Results[0].Device)
	}
	if ev := e.events("measured use and the workload's would not fit"); len(ev) == 0 {
		t.Errorf("the waiting claim does not say why: %q", e.events(""))
	}
}

// Who does not burst: a claim that is not its pod's own (Auto could not move it off a GPU
// that fills), and one under a policy that is not best-effort.
func TestOnlyRecreatableBestEffortClaimsBurst(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	e := newBurstEnv(t, 3, web, webPod)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	standalone, pod := templatePod("web", "web-7c9d5-b", "")
	standalone.OwnerReferences = nil
	e.create(standalone, pod)
	e.run()
	if r, capBytes := burstOf(t, e, standalone.Name); capBytes != 0 {
		t.Errorf("a standalone claim got burst cap %s on %s", fmtBytes(capBytes), r.Device)
	}
	pol := builders.MakePolicy("auto").Sizing(api.SizingAuto).Obj()
	if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, pol, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		if got, _ := e.c.policies.Get("auto"); got != nil && got.Spec.LatencyClass == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see the policy change")
		}
	}
	standard, pod2 := templatePod("web", "web-7c9d5-c", "")
	e.create(standard, pod2)
	e.run()
	if r, capBytes := burstOf(t, e, standard.Name); capBytes != 0 {
		t.Errorf("a standard claim got burst cap %s on %s", fmtBytes(capBytes), r.Device)
	}
}

// A restarted allocator knows the bursting shares' caps from their placements but not
// their history: each counts at its cap, so nothing is admitted next to them that their caps
// would not leave room for.
func TestARestartCountsBurstingSharesAtTheirCaps(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	burster, bursterPod := placedBurster("web", "web-7c9d5-b", "gpu-1", "10Gi", "60Gi")
	e := newBurstEnv(t, 2, web, webPod, burster, bursterPod)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	next, pod := templatePod("web", "web-7c9d5-c", "")
	e.create(next, pod)
	e.run()
	if c := e.claim("team-a", next.Name); c.Status.Allocation != nil {
		t.Fatalf("placed on %s next to a 60Gi cap with 10Gi peaks: 80Gi needed, %s admitted", c.Status.Allocation.Devices.Results[0].Device, "69.6Gi")
	}
	if ev := e.events("would not fit"); len(ev) == 0 || !strings.Contains(ev[0], "gpu-1") {
		t.Errorf("events %q", ev)
	}
}

// When a GPU's bursting tenants together near its memory, the one whose use grew most is
// evicted (to be placed again where its workload's use fits), through Auto's eviction path.
func TestAFillingGPUMovesTheTenantThatGrewMost(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	batch, batchPod := placedTemplatePod("batch", "batch-7c9d5-a", "gpu-1")
	e := newBurstEnv(t, 3, web, webPod, batch, batchPod)
	evicted := recordEvictions(e)
	reportPeaks(e, web.Name, 0, 35, 35, 35, 35, 35, 35, 5, 5, 5, 5, 5, 5)
	reportPeaks(e, batch.Name, 0, 5, 5, 5, 5, 5, 5, 35, 35, 35, 35, 35, 35)
	web2, web2Pod := templatePod("web", "web-7c9d5-b", "")
	batch2, batch2Pod := templatePod("batch", "batch-7c9d5-b", "")
	e.create(web2, web2Pod, batch2, batch2Pod)
	e.run()
	for _, name := range []string{web2.Name, batch2.Name} {
		if r, capBytes := burstOf(t, e, name); r.Device != "gpu-2" || capBytes == 0 {
			t.Fatalf("claim %s on %s with cap %d; want a bursting share on gpu-2", name, r.Device, capBytes)
		}
	}
	reportPeaks(e, web2.Name, 12, 10)
	reportPeaks(e, batch2.Name, 12, 30)
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 0 {
		t.Fatalf("evicted %v with 40Gi of 80Gi in use", *evicted)
	}
	reportPeaks(e, web2.Name, 13, 45)
	reportPeaks(e, batch2.Name, 13, 33)
	e.clock.Step(autoEvictInterval)
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 1 || (*evicted)[0] != web2Pod.Name {
		t.Fatalf("evicted %v; want %s, whose use grew by 35Gi when the GPU's tenants used 78Gi of 80Gi", *evicted, web2Pod.Name)
	}
	if ev := e.events(ReasonResizeEvicted); len(ev) != 1 || !strings.Contains(ev[0], "together used 78Gi") {
		t.Errorf("events %q", ev)
	}
	if n := testutil.ToFloat64(e.c.metrics.evicted.WithLabelValues("team-a", "relieve")); n != 1 {
		t.Errorf("fgpu_allocator_sizing_evictions_total{reason=relieve} is %v; want 1", n)
	}
}

// A workload whose newest report is older than the window (a Deployment scaled to zero for
// the weekend) says nothing about when its peaks come now: its new pods are placed per claim
// until it has reported again.
func TestAWorkloadBackAfterTheWindowDoesNotBurst(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	e := newBurstEnv(t, 3, web, webPod)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	e.clock.Step(25 * time.Hour)
	next, pod := templatePod("web", "web-7c9d5-b", "")
	e.create(next, pod)
	e.run()
	if r, capBytes := burstOf(t, e, next.Name); capBytes != 0 {
		t.Errorf("placed with burst cap %s on %s from a history a day old", fmtBytes(capBytes), r.Device)
	}
}

// The quota charges a bursting share its cap, not its guarantee: its GPU is closed to other
// namespaces, and shares guaranteed little must not hold GPU after GPU under a small quota.
// A share whose cap the quota does not take runs as Initial sizes it.
func TestQuotaChargesABurstingShareItsCap(t *testing.T) {
	web, webPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
	objs := []runtime.Object{web, webPod, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 3, "80Gi")}
	e := newEnvWith(t, func(c *Config) {
		c.Sizing = sizing.DefaultOptions()
		c.Sizing.MinSamples = 90
		c.SizingShrinkAfter = 24 * time.Hour
	}, []*api.SharingPolicy{builders.MakePolicy("auto").Sizing(api.SizingAuto).Latency(api.LatencyBestEffort).QuotaMemory("110Gi").Obj()}, objs...)
	reportPeaks(e, web.Name, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 20)
	next, pod := templatePod("web", "web-7c9d5-b", "")
	e.create(next, pod)
	e.run()
	r, capBytes := burstOf(t, e, next.Name)
	if capBytes != 40<<30 {
		t.Fatalf("burst cap %s on %s; want 40Gi (twice the 20Gi peak)", fmtBytes(capBytes), r.Device)
	}
	// Two 40Gi caps charged: a third pod's 40Gi cap would pass the 110Gi quota, though the
	// size Initial gives it (about 24Gi) would not. It runs at that size, and is told why it
	// does not burst.
	third, pod3 := templatePod("web", "web-7c9d5-c", "")
	e.create(third, pod3)
	e.run()
	if r, capBytes := burstOf(t, e, third.Name); capBytes != 0 {
		t.Fatalf("a third pod bursts on %s: three 40Gi caps charged against a 110Gi quota", r.Device)
	}
	if ev := e.events("does not burst, for now"); len(ev) == 0 || !strings.Contains(ev[0], "quota") {
		t.Errorf("the third pod is not told the quota keeps it from bursting: %q", e.events(""))
	}
}

// A pod placed before its workload was measured (it holds the whole GPU it asked for) is
// recreated to burst once the workload is measured, through Auto's eviction path; a pod
// placed since that still does not burst had a reason not to, and is left alone.
func TestAPodPlacedBeforeItsWorkloadWasMeasuredIsRecreatedToBurst(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	web.Status.Allocation.AllocationTimestamp = &metav1.Time{Time: burstT0.Add(-time.Minute)}
	late, latePod := placedTemplatePod("web", "web-7c9d5-b", "gpu-1")
	late.Status.Allocation.AllocationTimestamp = &metav1.Time{Time: burstT0.Add(2 * time.Hour)}
	e := newBurstEnv(t, 3, web, webPod, late, latePod)
	evicted := recordEvictions(e)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10)
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 0 {
		t.Fatalf("evicted %v before the workload had %d report intervals", *evicted, engine.MinIntervals)
	}
	reportPeaks(e, web.Name, 5, 10)
	reportPeaks(e, late.Name, 5, 10)
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 1 || (*evicted)[0] != webPod.Name {
		t.Fatalf("evicted %v; want only %s, placed before its workload was measured", *evicted, webPod.Name)
	}
	if ev := e.events(ReasonResizeEvicted); len(ev) != 1 || !strings.Contains(ev[0], "may burst") || !strings.Contains(ev[0], "capped at 20Gi") {
		t.Errorf("events %q", ev)
	}
	reportPeaks(e, late.Name, 6, 10)
	e.c.sizing.sizer.mu.Lock()
	_, queued := e.c.sizing.sizer.auto.wants[latePod.UID]
	e.c.sizing.sizer.mu.Unlock()
	if queued {
		t.Errorf("the pod placed after its workload was measured is queued to be recreated")
	}
}

// recordEvictions answers the env's evictions as allowed, and lists the pods evicted.
func recordEvictions(e *env) *[]string {
	var evicted []string
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "eviction" {
			return false, nil, nil
		}
		if ev, ok := create.GetObject().(*policyv1.Eviction); ok {
			evicted = append(evicted, ev.Name)
		}
		return true, nil, nil
	})
	return &evicted
}

// A share that may burst but that no GPU admits runs as Initial sizes it, next to a share
// that does not burst, and is told why it does not burst.
func TestAShareNoGPUAdmitsRunsUnburst(t *testing.T) {
	web, webPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	web.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory] = resource.MustParse("10Gi")
	e := newBurstEnv(t, 2, web, webPod)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	var bursting []string
	for _, name := range []string{"web-7c9d5-b", "web-7c9d5-c", "web-7c9d5-d", "web-7c9d5-e", "web-7c9d5-f", "web-7c9d5-g", "web-7c9d5-h"} {
		c, p := templatePod("web", name, "")
		e.create(c, p)
		e.run()
		if _, capBytes := burstOf(t, e, c.Name); capBytes > 0 {
			bursting = append(bursting, c.Name)
			continue
		}
		// gpu-1 took the bursting shares it has room for (compute, at 19% each, runs out
		// first); this one no GPU admits, and gpu-0 holds a share that does not burst.
		if r, _ := burstOf(t, e, c.Name); r.Device != "gpu-0" {
			t.Fatalf("claim %s runs unburst on %s; want gpu-0, beside the share that does not burst", c.Name, r.Device)
		}
		if ev := e.events("does not burst, for now"); len(ev) != 1 || !strings.Contains(ev[0], "bursting and non-bursting shares do not share a GPU") {
			t.Errorf("events %q; want one saying why it does not burst", ev)
		}
		if len(bursting) == 0 {
			t.Error("no share burst on gpu-1 before")
		}
		return
	}
	t.Fatalf("every claim burst: %v", bursting)
}

// A pod that would come back the same is not recreated to burst: one holding the whole GPU
// it asked for, whose recommendation fills the GPU (Initial keeps such a request whole).
func TestAPodThatWouldComeBackTheSameIsNotRecreated(t *testing.T) {
	big, bigPod := placedTemplatePod("web", "web-7c9d5-a", "gpu-0")
	big.Status.Allocation.AllocationTimestamp = &metav1.Time{Time: burstT0.Add(-time.Minute)}
	e := newBurstEnv(t, 2, big, bigPod)
	evicted := recordEvictions(e)
	reportPeaks(e, big.Name, 0, 75, 75, 75, 75, 75, 75, 75, 75, 75, 75, 75, 75)
	e.c.sizing.evictForResize(e.ctx)
	e.c.sizing.sizer.mu.Lock()
	queued := len(e.c.sizing.sizer.auto.wants)
	e.c.sizing.sizer.mu.Unlock()
	if len(*evicted) != 0 || queued != 0 {
		t.Errorf("evicted %v, %d queued: a whole GPU its recommendation fills comes back whole", *evicted, queued)
	}
}

// placedBurster is templatePod placed on n1's device as a bursting share, guaranteed
// guaranteed and capped at capText.
func placedBurster(dep, name, device, guaranteed, capText string) (*resourceapi.ResourceClaim, *corev1.Pod) {
	claim, p := placedTemplatePod(dep, name, device)
	claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory] = resource.MustParse(guaranteed)
	raw := `{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig","mode":"mps","placement":{"latencyClass":"bestEffort","memoryLimit":"` + capText + `"}}`
	claim.Status.Allocation.Devices.Config = append(claim.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}})
	return claim, p
}

// Two bursting pods of one workload left alone on two GPUs (their co-tenants gone) would fit
// on one: Auto empties the GPU guaranteed least, through its eviction path, keeps new bursting
// shares off it while it drains, and ends the drain once it is empty.
func TestConsolidationEmptiesAGPUWhoseTenantsFitElsewhere(t *testing.T) {
	small, smallPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
	big, bigPod := placedBurster("web", "web-7c9d5-b", "gpu-1", "20Gi", "40Gi")
	batch, batchPod := placedTemplatePod("batch", "batch-7c9d5-a", "gpu-2")
	e := newBurstEnv(t, 3, small, smallPod, big, bigPod, batch, batchPod)
	evicted := recordEvictions(e)
	reportPeaks(e, small.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	reportPeaks(e, big.Name, 0, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20)
	reportPeaks(e, batch.Name, 0, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); !ok || key.Device != "gpu-0" {
		t.Fatalf("draining %v (%v); want gpu-0, whose 10Gi tenant fits next to gpu-1's", key, ok)
	}
	// No bursting share is placed on the GPU being emptied: batch's would fit next to
	// gpu-0's 10Gi, not next to gpu-1's 20Gi.
	batch2, batch2Pod := templatePod("batch", "batch-7c9d5-b", "")
	e.create(batch2, batch2Pod)
	e.run()
	if c := e.claim("team-a", batch2.Name); c.Status.Allocation != nil {
		t.Fatalf("batch's new pod was placed on %s while gpu-0 drains", c.Status.Allocation.Devices.Results[0].Device)
	}
	if ev := e.events("being emptied by sizing Auto"); len(ev) == 0 {
		t.Errorf("the waiting claim does not say gpu-0 is being emptied: %q", e.events(""))
	}
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 1 || (*evicted)[0] != smallPod.Name {
		t.Fatalf("evicted %v; want %s", *evicted, smallPod.Name)
	}
	if ev := e.events(ReasonResizeEvicted); len(ev) != 1 || !strings.Contains(ev[0], "sizing Auto empties n1/gpu-0") || !strings.Contains(ev[0], "this one on n1/gpu-1") {
		t.Errorf("events %q", ev)
	}
	if n := testutil.ToFloat64(e.c.metrics.evicted.WithLabelValues("team-a", "consolidate")); n != 1 {
		t.Errorf("fgpu_allocator_sizing_evictions_total{reason=consolidate} is %v; want 1", n)
	}
	// The replacement comes while the evicted pod's claim still holds gpu-0: it goes to
	// gpu-1, not back to the GPU being emptied nor to the empty one.
	next, nextPod := templatePod("web", "web-7c9d5-c", "")
	e.create(next, nextPod)
	e.run()
	if r, capBytes := burstOf(t, e, next.Name); r.Device != "gpu-1" || capBytes == 0 {
		t.Fatalf("the replacement is on %s with cap %d; want a bursting share on gpu-1", r.Device, capBytes)
	}
	e.c.sizing.consolidate(e.ctx)
	if _, _, ok := e.c.sizing.burst.Draining(); !ok {
		t.Fatal("the drain ended while gpu-0 still holds the evicted pod's share")
	}
	_ = e.client.CoreV1().Pods("team-a").Delete(e.ctx, smallPod.Name, metav1.DeleteOptions{})
	if err := e.client.ResourceV1().ResourceClaims("team-a").Delete(e.ctx, small.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); ok {
		t.Errorf("still draining %v once gpu-0 is empty", key)
	}
	e.checkInvariant()
}

// A GPU is not emptied where a tenant would fit nowhere else, nor where one would not come
// back (its claim is not its pod's own); and a drain whose tenant stops fitting elsewhere
// ends, its eviction dropped.
func TestConsolidationMovesOnlyWhatFitsAndComesBack(t *testing.T) {
	pair := func(batchPeaks ...int64) *env {
		web, webPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
		batch, batchPod := placedBurster("batch", "batch-7c9d5-a", "gpu-1", "20Gi", "70Gi")
		e := newBurstEnv(t, 3, web, webPod, batch, batchPod)
		reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
		reportPeaks(e, batch.Name, 0, batchPeaks...)
		return e
	}
	e := pair(20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 60)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); ok {
		t.Fatalf("draining %v: batch's 60Gi next to web's 10Gi passes the 69.6Gi admitted, either way", key)
	}

	e = pair(20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20)
	evicted := recordEvictions(e)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); !ok || key.Device != "gpu-0" {
		t.Fatalf("draining %v (%v); want gpu-0, whose tenant fits next to gpu-1's", key, ok)
	}
	// gpu-1's tenant's use grows before the eviction's turn: the tenant of gpu-0 no longer
	// fits there, and the eviction checks that first: the drain ends.
	reportPeaks(e, "batch-7c9d5-a-gpu", 12, 60)
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 0 {
		t.Errorf("evicted %v though gpu-0's tenant no longer fits on gpu-1", *evicted)
	}
	if key, _, ok := e.c.sizing.burst.Draining(); ok {
		t.Fatalf("still draining %v though its tenant no longer fits on gpu-1", key)
	}

	web, webPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
	web.OwnerReferences = nil
	other, otherPod := placedBurster("web", "web-7c9d5-b", "gpu-1", "20Gi", "40Gi")
	e = newBurstEnv(t, 3, web, webPod, other, otherPod)
	reportPeaks(e, web.Name, 0, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10)
	reportPeaks(e, other.Name, 0, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20, 20)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); ok && key.Device == "gpu-0" {
		t.Errorf("draining gpu-0: its tenant's claim is not its pod's own, and nothing would recreate it")
	}
}

// A drain whose eviction a PodDisruptionBudget refuses ends at once and leaves its GPU alone
// for engine.DrainGiveUp, so that other GPUs are emptied meanwhile; a drain that has not emptied
// its GPU within engine.DrainGiveUp gives up the same way.
func TestConsolidationMovesOnWhenADrainIsHeld(t *testing.T) {
	small, smallPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
	big, bigPod := placedBurster("web", "web-7c9d5-b", "gpu-1", "20Gi", "40Gi")
	e := newBurstEnv(t, 3, small, smallPod, big, bigPod)
	e.client.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "eviction" {
			// As the API server refuses it: 429, with the disruption budget as its cause.
			err := apierrors.NewTooManyRequests("Cannot evict pod as it would violate the pod's disruption budget.", 0)
			err.ErrStatus.Details.Causes = []metav1.StatusCause{{Type: policyv1.DisruptionBudgetCause, Message: "The disruption budget web needs 2 healthy pods and has 2 currently"}}
			return true, nil, err
		}
		return false, nil, nil
	})
	reportPeaks(e, small.Name, 0, 10, 10, 10, 10, 10, 10)
	reportPeaks(e, big.Name, 0, 20, 20, 20, 20, 20, 20)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); !ok || key.Device != "gpu-0" {
		t.Fatalf("draining %v (%v); want gpu-0", key, ok)
	}
	e.c.sizing.evictForResize(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); ok {
		t.Fatalf("still draining %v after its eviction was refused", key)
	}
	if ev := e.events("is not emptied"); len(ev) != 1 || !strings.Contains(ev[0], "disruption budget") {
		t.Errorf("events %q; want the pod told that its GPU is not emptied", e.events(""))
	}
	// gpu-0 rests; gpu-1's tenant fits beside gpu-0's, so gpu-1 is emptied instead.
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); !ok || key.Device != "gpu-1" {
		t.Fatalf("draining %v (%v); want gpu-1 while gpu-0 rests", key, ok)
	}
	// No eviction is tried for engine.DrainGiveUp (the budget is not asked again here): the drain
	// gives up, and that pass starts none.
	e.c.sizing.sizer.mu.Lock()
	for _, w := range e.c.sizing.sizer.auto.wants {
		w.notBefore = e.clock.Now().Add(2 * engine.DrainGiveUp)
	}
	e.c.sizing.sizer.mu.Unlock()
	e.clock.Step(engine.DrainGiveUp)
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); ok {
		t.Fatalf("draining %v in the pass that gave up on gpu-1", key)
	}
	e.c.sizing.sizer.mu.Lock()
	wants := len(e.c.sizing.sizer.auto.wants)
	e.c.sizing.sizer.mu.Unlock()
	if wants != 0 {
		t.Errorf("%d evictions still wanted after the drain gave up", wants)
	}
	if !e.c.sizing.burst.Resting(model.GPUKey{Pool: "n1", Device: "gpu-1"}, e.clock.Now()) {
		t.Errorf("gpu-1 is not left alone after its drain gave up")
	}
	// gpu-0 rested for engine.DrainGiveUp too: it may be emptied again; gpu-1 rests now.
	e.c.sizing.consolidate(e.ctx)
	if key, _, ok := e.c.sizing.burst.Draining(); !ok || key.Device != "gpu-0" {
		t.Errorf("draining %v (%v); want gpu-0 again, its rest over", key, ok)
	}
}

// A drain want whose drain ended (an eviction ended it while a pass was planning) evicts
// nothing.
func TestConsolidationEvictsNothingForADrainThatEnded(t *testing.T) {
	small, smallPod := placedBurster("web", "web-7c9d5-a", "gpu-0", "10Gi", "40Gi")
	big, bigPod := placedBurster("web", "web-7c9d5-b", "gpu-1", "20Gi", "40Gi")
	e := newBurstEnv(t, 3, small, smallPod, big, bigPod)
	evicted := recordEvictions(e)
	reportPeaks(e, small.Name, 0, 10, 10, 10, 10, 10, 10)
	reportPeaks(e, big.Name, 0, 20, 20, 20, 20, 20, 20)
	e.c.sizing.consolidate(e.ctx)
	key, since, ok := e.c.sizing.burst.Draining()
	if !ok {
		t.Fatal("no drain")
	}
	// The drain ends, as an eviction's re-check ends it, without the planning pass seeing it.
	e.c.sizing.burst.ClearDraining(key, e.clock.Now(), time.Time{})
	e.c.sizing.wantMoves(key, since, []drainMove{{pod: bigPod, claim: big.Name, share: "x", to: key}}, e.clock.Now())
	e.c.sizing.evictForResize(e.ctx)
	if len(*evicted) != 0 {
		t.Errorf("evicted %v for a drain that ended", *evicted)
	}
}
