package controller

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/policy"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

func ownedPod(ns, name, kind, owner string, labels map[string]string) *corev1.Pod {
	p := builders.MakePod(ns, name).Claim("c").Bound("n1").Obj()
	p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: owner, Controller: ptr.To(true)}}
	for k, v := range labels {
		p.Labels[k] = v
	}
	return p
}

// usageStatus is the status.devices entry the kubelet plugin writes for the claim's share.
func usageStatus(t *testing.T, claim *resourceapi.ResourceClaim, shareID string, u api.ShareUsage) resourceapi.AllocatedDeviceStatus {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"gpuUUID": "GPU-x", "usage": u})
	if err != nil {
		t.Fatal(err)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	return resourceapi.AllocatedDeviceStatus{Driver: api.DriverName, Pool: r.Pool, Device: r.Device, ShareID: &shareID, Data: &runtime.RawExtension{Raw: raw}}
}

// sizingEnv is a controller whose namespace team-a has a Deployment web's pod with claim c
// placed on one of n1's four 80Gi GPUs, under a policy of the given sizing mode; report writes the
// plugin's usage summary i (5 min of 30 samples) into c's status.
type sizingEnv struct {
	*env
	share string
	w     api.SizingWorkload
}

func newSizingEnv(t *testing.T, mode api.SizingMode) *sizingEnv {
	return newSizingEnvWith(t, builders.MakePolicy("sizing").Sizing(mode).Obj())
}

// newSizingEnvWith is newSizingEnv under policy pol.
func newSizingEnvWith(t *testing.T, pol *api.SharingPolicy) *sizingEnv {
	claim := builders.MakeClaim("team-a", "c").Memory("40Gi").AllocatedOn("n1", "gpu-0").Obj()
	pod := ownedPod("team-a", "web-7c9d5-abcde", "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	e := newEnvWith(t, func(c *Config) {
		c.Sizing = sizing.DefaultOptions()
		c.Sizing.MinSamples = 90
	}, []*api.SharingPolicy{pol},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), claim, pod)
	return &sizingEnv{env: e, share: string(*claim.Status.Allocation.Devices.Results[0].ShareID),
		w: api.SizingWorkload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"}}
}

func (e *sizingEnv) report(i int, peakGiB int64, sid string) {
	e.t.Helper()
	e.reportSM(i, peakGiB, 35, sid)
}

// reportSM is report with the summary's SM p95 at sm percent.
func (e *sizingEnv) reportSM(i int, peakGiB int64, sm int, sid string) {
	e.t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cur := e.claim("team-a", "c")
	cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(e.t, cur, sid, api.ShareUsage{
		From: t0.Add(time.Duration(i-1) * 5 * time.Minute), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
		MemoryMaxBytes: peakGiB << 30, SMSamples: 30, SMP95Percent: sm})}
	if _, err := e.client.ResourceV1().ResourceClaims("team-a").UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.settle()
}

func TestRecommendationFromMeasuredUsage(t *testing.T) {
	e := newSizingEnv(t, api.SizingRecommend)
	e.report(1, 9, e.share)
	e.report(2, 11, e.share)
	if _, ok := e.c.Recommendation(e.w); ok {
		t.Fatal("a recommendation on 60 samples")
	}
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 0 {
		t.Fatalf("events before enough samples: %q", ev)
	}
	// A status entry for a share the allocation does not hold is not the claim's use.
	e.report(3, 70, "00000000-0000-0000-0000-000000000000")
	if _, ok := e.c.Recommendation(e.w); ok {
		t.Fatal("a share outside the allocation counted")
	}
	e.report(3, 10, e.share)
	rec, ok := e.c.Recommendation(e.w)
	if !ok || rec.PeakBytes != 11<<30 || rec.MemoryBytes < 11<<30 || rec.MemoryBytes > 13<<30 {
		t.Fatalf("recommendation %+v, %v; want above the 11Gi peak with headroom", rec, ok)
	}
	ev := e.awaitEvents(ReasonSizingRecommendation, 1)
	if len(ev) != 1 || !strings.Contains(ev[0], "Deployment team-a/web request gpu: recommended memory") || !strings.Contains(ev[0], "sizing Recommend: nothing is changed") {
		t.Fatalf("events %q; want one recommendation for Deployment web", ev)
	}
	// The same report again (a resync) changes nothing, and an unmoved one tells no one.
	e.report(3, 10, e.share)
	e.report(4, 10, e.share)
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 1 {
		t.Fatalf("events %q; want still one", ev)
	}
	if got, _ := e.c.Recommendation(e.w); got.Samples != 120 {
		t.Fatalf("samples %d; want 120 (the repeated report counted once)", got.Samples)
	}
	// Told again once the first event may have expired, though it did not move: readers
	// find recommendations only in the events the API server still keeps.
	e.clock.Step(retellEvery)
	e.report(5, 10, e.share)
	if ev := e.awaitEvents(ReasonSizingRecommendation, 2); len(ev) != 2 {
		t.Fatalf("events %q; want the unmoved recommendation told again after %s", ev, retellEvery)
	}
	// Recommend changes no new claim of the workload.
	e.create(builders.MakeClaim("team-a", "c2").Memory("40Gi").Obj(), sizedPod("web-7c9d5-fghij", "c2"))
	e.run()
	if got := e.claim("team-a", "c2").Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]; got.String() != "40Gi" {
		t.Errorf("under Recommend a new claim got %s; want the 40Gi it asked", got.String())
	}
}

// Off keeps the history but tells no one.
func TestSizingOffTellsNothing(t *testing.T) {
	e := newSizingEnv(t, api.SizingOff)
	for i := 1; i <= 4; i++ {
		e.report(i, 10, e.share)
	}
	if _, ok := e.c.Recommendation(e.w); !ok {
		t.Fatal("no history kept under Off")
	}
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 0 {
		t.Fatalf("events under Off: %q", ev)
	}
}

// sizedPod is another pod of Deployment web, using claim.
func sizedPod(name, claim string) *corev1.Pod {
	p := ownedPod("team-a", name, "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: claim, ResourceClaimName: ptr.To(claim)}}
	return p
}

// Under Initial, new claims of the workload are placed at the recommended size, never above
// what they ask nor below the limits they set; other workloads and claims without enough
// samples keep what they ask.
func TestSizingInitialSizesNewClaims(t *testing.T) {
	e := newSizingEnv(t, api.SizingInitial)
	// Not enough samples yet: a new claim keeps its ask.
	e.create(builders.MakeClaim("team-a", "early").Memory("40Gi").Obj(), sizedPod("web-7c9d5-early", "early"))
	e.run()
	mem := func(name string) string {
		c := e.claim("team-a", name)
		if c.Status.Allocation == nil {
			t.Fatalf("claim %s not allocated: %v %q", name, c.Annotations, e.events(name))
		}
		q := c.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]
		return q.String()
	}
	if got := mem("early"); got != "40Gi" {
		t.Fatalf("before the recommendation: %s; want 40Gi", got)
	}
	for i := 1; i <= 3; i++ {
		e.report(i, 7, e.share)
	}
	rec, ok := e.c.Recommendation(e.w)
	if !ok {
		t.Fatal("no recommendation")
	}
	want := resource.NewQuantity(rec.MemoryBytes, resource.BinarySI).String()
	whole := builders.MakeClaim("team-a", "whole").Obj() // no memory: a whole GPU
	limited := builders.MakeClaim("team-a", "limited").Memory("30Gi").Config(map[string]any{"memoryLimit": "20Gi"}).Obj()
	small := builders.MakeClaim("team-a", "small").Memory("4Gi").Obj()
	other := ownedPod("team-a", "db-0", "StatefulSet", "db", nil)
	other.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "o", ResourceClaimName: ptr.To("o")}}
	e.create(builders.MakeClaim("team-a", "c2").Memory("40Gi").Obj(), sizedPod("web-7c9d5-fghij", "c2"),
		whole, sizedPod("web-7c9d5-whole", "whole"), limited, sizedPod("web-7c9d5-limited", "limited"),
		small, sizedPod("web-7c9d5-small", "small"), builders.MakeClaim("team-a", "o").Memory("40Gi").Obj(), other)
	e.run()
	for name, wantMem := range map[string]string{"c2": want, "whole": want, "limited": "30Gi", "small": "4Gi", "o": "40Gi"} {
		if got := mem(name); got != wantMem {
			t.Errorf("claim %s: %s; want %s", name, got, wantMem)
		}
	}
	ev := e.events(ReasonSized)
	if len(ev) != 2 || !strings.Contains(strings.Join(ev, "\n"), "memory "+fmtBytes(rec.MemoryBytes)+" (asked 40Gi)") ||
		!strings.Contains(strings.Join(ev, "\n"), "(asked a whole GPU)") {
		t.Errorf("FgpuSized events %q; want c2's and whole's", ev)
	}
	e.checkInvariant()
}

// allocatedClaim is claim name of team-a, failing the test where it was not placed.
func (e *sizingEnv) allocatedClaim(name string) *resourceapi.ResourceClaim {
	e.t.Helper()
	c := e.claim("team-a", name)
	if c.Status.Allocation == nil {
		e.t.Fatalf("claim %s not allocated: annotations %v, events %q", name, c.Annotations, e.events(""))
	}
	return c
}

// A workload that uses most of a GPU is recommended more than the GPU has (peak, bucket
// rounding and headroom): a claim of it that asks for a whole GPU stays whole, rather than
// become a share no GPU can take.
func TestSizingKeepsAWholeGPUWholeWhenTheRecommendationFillsIt(t *testing.T) {
	e := newSizingEnv(t, api.SizingInitial)
	for i := 1; i <= 3; i++ {
		e.report(i, 75, e.share)
	}
	rec, ok := e.c.Recommendation(e.w)
	if !ok || rec.MemoryBytes < 80<<30 {
		t.Fatalf("recommendation %+v, %v; want one above the 80Gi GPUs", rec, ok)
	}
	e.create(builders.MakeClaim("team-a", "whole").Obj(), sizedPod("web-7c9d5-whole", "whole"))
	e.run()
	got := e.allocatedClaim("whole").Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]
	if got.String() != "80Gi" {
		t.Errorf("whole-GPU claim got %s; want the whole 80Gi GPU", got.String())
	}
	if ev := e.events(ReasonSized); len(ev) != 0 {
		t.Errorf("FgpuSized events %q for a claim left as it asked", ev)
	}
	e.checkInvariant()
}

// A whole-GPU claim sized to a share gets the workload's recommended compute, not the
// compute the policy derives from the share's (small) memory.
func TestSizingWholeGPUGetsTheRecommendedCompute(t *testing.T) {
	e := newSizingEnvWith(t, builders.MakePolicy("sizing").Sizing(api.SizingInitial).ComputeFromMemory().Obj())
	for i := 1; i <= 3; i++ {
		e.report(i, 7, e.share)
	}
	rec, ok := e.c.Recommendation(e.w)
	if !ok {
		t.Fatal("no recommendation")
	}
	e.create(builders.MakeClaim("team-a", "whole").Obj(), sizedPod("web-7c9d5-whole", "whole"))
	e.run()
	res := e.allocatedClaim("whole").Status.Allocation.Devices.Results[0]
	mem, comp := res.ConsumedCapacity[api.CapacityMemory], res.ConsumedCapacity[api.CapacityCompute]
	if mem.Value() != rec.MemoryBytes || comp.Value() != int64(rec.ComputePercent) {
		t.Errorf("whole-GPU claim sized to %s, %s%% compute; want the recommendation %s, %d%%", mem.String(), comp.String(), fmtBytes(rec.MemoryBytes), rec.ComputePercent)
	}
	if ev := e.events(ReasonSized); len(ev) != 1 || !strings.Contains(ev[0], fmt.Sprintf("compute %d%%", rec.ComputePercent)) {
		t.Errorf("FgpuSized events %q; want one that names the compute", ev)
	}
}

// A whole-GPU claim whose config sets a computePercent above the recommended compute is
// sized to a share with that much compute: the plugin would refuse a share with less, and
// the claim, which fit whole, would wait for ever.
func TestSizingWholeGPUKeepsItsComputePercent(t *testing.T) {
	e := newSizingEnvWith(t, builders.MakePolicy("sizing").Sizing(api.SizingInitial).ComputeFromMemory().Obj())
	for i := 1; i <= 3; i++ {
		e.report(i, 7, e.share)
	}
	rec, ok := e.c.Recommendation(e.w)
	if !ok || rec.ComputePercent >= 50 {
		t.Fatalf("recommendation %+v, %v; want one below 50%% compute", rec, ok)
	}
	e.create(builders.MakeClaim("team-a", "whole").Config(map[string]any{"computePercent": 50}).Obj(), sizedPod("web-7c9d5-whole", "whole"))
	e.run()
	res := e.allocatedClaim("whole").Status.Allocation.Devices.Results[0]
	mem, comp := res.ConsumedCapacity[api.CapacityMemory], res.ConsumedCapacity[api.CapacityCompute]
	if mem.Value() != rec.MemoryBytes || comp.Value() != 50 {
		t.Errorf("whole-GPU claim with computePercent 50 sized to %s, %s%% compute; want %s, 50%%", mem.String(), comp.String(), fmtBytes(rec.MemoryBytes))
	}
	e.checkInvariant()
}

// The allocator forgets a workload no claim reported for ForgetAfterHalfLives half-lives,
// and what it told of it: reports that come back later start a new history, told anew.
func TestSizingForgetsASilentWorkload(t *testing.T) {
	e := newSizingEnv(t, api.SizingRecommend)
	for i := 1; i <= 3; i++ {
		e.report(i, 10, e.share)
	}
	if _, ok := e.c.Recommendation(e.w); !ok {
		t.Fatal("no recommendation")
	}
	last := time.Date(2026, 1, 1, 0, 15, 0, 0, time.UTC)
	e.clock.SetTime(last.Add(sizing.ForgetAfterHalfLives*e.c.cfg.Sizing.HalfLife - time.Minute))
	e.c.sizing.sweepUsage(e.ctx)
	if _, ok := e.c.Recommendation(e.w); !ok {
		t.Fatal("forgotten before its time")
	}
	e.clock.SetTime(last.Add(sizing.ForgetAfterHalfLives*e.c.cfg.Sizing.HalfLife + time.Minute))
	e.c.sizing.sweepUsage(e.ctx)
	if _, ok := e.c.Recommendation(e.w); ok {
		t.Fatal("a workload silent for 8 half-lives is still recommended")
	}
	// 8 days later, 90 new samples: told again.
	for i := 1; i <= 3; i++ {
		e.report(8*24*12+i, 10, e.share)
	}
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 2 {
		t.Errorf("events %q; want the first recommendation and the new one", ev)
	}
}

// Mode auto's rule: what a policy or the claim names stands; without a measurement, MPS;
// a workload that keeps a GPU busy gains nothing from sharing; a best-effort, mostly idle one
// is time-sliced; every other one, latency-critical always, gets MPS with caps.
func TestSharingModeFromMeasurement(t *testing.T) {
	busy := api.SizingRecommendation{MemoryBytes: 8 << 30, ComputePercent: 95}
	idle := api.SizingRecommendation{MemoryBytes: 8 << 30, ComputePercent: 5}
	some := api.SizingRecommendation{MemoryBytes: 8 << 30, ComputePercent: 40}
	auto := func(l api.LatencyClass) policy.Effective {
		return policy.Effective{Mode: api.PolicyModeAuto, Latency: l}
	}
	for _, c := range []struct {
		name     string
		pol      policy.Effective
		cfg      api.GpuConfig
		rec      api.SizingRecommendation
		measured bool
		want     api.SharingMode
		note     string
	}{
		{"policy mps", policy.Effective{Mode: api.PolicyModeMPS, Latency: api.LatencyBestEffort}, api.GpuConfig{}, idle, true, api.SharingModeMPS, ""},
		{"policy time-slicing", policy.Effective{Mode: api.PolicyModeTimeSlicing}, api.GpuConfig{}, busy, true, api.SharingModeTimeSlicing, ""},
		{"claim's mode", auto(api.LatencyBestEffort), api.GpuConfig{Mode: api.SharingModeMPS}, idle, true, api.SharingModeMPS, ""},
		{"not measured", auto(api.LatencyBestEffort), api.GpuConfig{}, api.SizingRecommendation{}, false, api.SharingModeMPS, ""},
		{"busy", auto(api.LatencyBestEffort), api.GpuConfig{}, busy, true, api.SharingModeMPS, busyNote},
		{"idle best-effort", auto(api.LatencyBestEffort), api.GpuConfig{}, idle, true, api.SharingModeTimeSlicing, idleNote},
		{"idle critical", auto(api.LatencyCritical), api.GpuConfig{}, idle, true, api.SharingModeMPS, ""},
		{"idle standard", auto(api.LatencyStandard), api.GpuConfig{}, idle, true, api.SharingModeMPS, ""},
		{"some best-effort", auto(api.LatencyBestEffort), api.GpuConfig{}, some, true, api.SharingModeMPS, ""},
	} {
		mode, note := sharingMode(c.pol, &c.cfg, c.rec, c.measured)
		if mode != c.want || note != c.note {
			t.Errorf("%s: %s %q; want %s %q", c.name, mode, note, c.want, c.note)
		}
	}
}

// Under mode auto and sizing Initial, a whole-GPU claim of a workload that keeps its GPU busy
// stays whole, and says why; a best-effort, mostly idle one is sized and time-sliced.
func TestModeAutoFromMeasurement(t *testing.T) {
	e := newSizingEnv(t, api.SizingInitial)
	for i := 1; i <= 3; i++ {
		e.reportSM(i, 7, 99, e.share)
	}
	e.create(builders.MakeClaim("team-a", "whole").Obj(), sizedPod("web-7c9d5-whole", "whole"))
	e.run()
	got := e.allocatedClaim("whole").Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]
	if got.String() != "80Gi" {
		t.Errorf("busy workload's whole-GPU claim got %s; want the whole 80Gi GPU", got.String())
	}
	if ev := e.events(ReasonSized); len(ev) != 1 || !strings.Contains(ev[0], "keeps the whole GPU it asked for") {
		t.Errorf("FgpuSized events %q; want one saying it stays whole", ev)
	}

	e = newSizingEnvWith(t, builders.MakePolicy("sizing").Sizing(api.SizingInitial).Latency(api.LatencyBestEffort).Obj())
	for i := 1; i <= 3; i++ {
		e.reportSM(i, 7, 2, e.share)
	}
	e.create(builders.MakeClaim("team-a", "idle").Obj(), sizedPod("web-7c9d5-idle", "idle"))
	e.run()
	c := e.allocatedClaim("idle")
	if mem := c.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]; mem.Value() >= 80<<30 {
		t.Errorf("idle workload's claim got %s; want it sized", mem.String())
	}
	if ev := e.events(ReasonSized); len(ev) != 1 || !strings.Contains(ev[0], "mode timeSlicing from measurement") {
		t.Errorf("FgpuSized events %q; want one naming time-slicing", ev)
	}
	var cfg api.GpuConfig
	for _, dc := range c.Status.Allocation.Devices.Config {
		if dc.Opaque != nil {
			_ = json.Unmarshal(dc.Opaque.Parameters.Raw, &cfg)
		}
	}
	if cfg.Mode != api.SharingModeTimeSlicing {
		t.Errorf("allocation config mode %q; want timeSlicing", cfg.Mode)
	}
	e.checkInvariant()
}
