package controller

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// deployment is a Deployment of ns with replicas and annotations (nil: none).
func deployment(ns, name string, replicas int32, annotations map[string]string) *appsv1.Deployment {
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations, ResourceVersion: "1"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas)}}
}

// idleClaim is pod of Deployment web in team-a with its own claim, placed at capGiB and 20%.
func idleClaim(pod string, capGiB int64) (*resourceapi.ResourceClaim, *corev1.Pod) {
	p := ownedPod("team-a", pod, "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	claim := builders.MakeClaim("team-a", pod+"-gpu").Memory("10Gi").AllocatedOn("n1", "gpu-0").Obj()
	r := &claim.Status.Allocation.Devices.Results[0]
	r.ShareID = ptr.To(types.UID(pod))
	r.ConsumedCapacity[api.CapacityMemory] = *resource.NewQuantity(capGiB<<30, resource.BinarySI)
	r.ConsumedCapacity[api.CapacityCompute] = *resource.NewQuantity(20, resource.DecimalSI)
	claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: p.Name, UID: p.UID, Controller: ptr.To(true)}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim.Name)}}
	return claim, p
}

type idleEnv struct{ *env }

func newIdleEnv(t *testing.T, web *appsv1.Deployment) *idleEnv {
	a, pa := idleClaim("web-a", 10)
	b, pb := idleClaim("web-b", 10)
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), a, pa, b, pb}
	if web != nil {
		objs = append(objs, web)
	}
	return &idleEnv{newEnv(t, []*api.SharingPolicy{builders.MakePolicy("idle").IdleScaleDown(10 * time.Minute).Obj()}, objs...)}
}

// report writes summary i (minutes 5(i-1) to 5i) of the claim's share with the given SM
// activity peak and SM sample count.
func (e *idleEnv) report(claimName string, i, smMax, smSamples int) {
	e.t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cur := e.claim("team-a", claimName)
	share := string(*cur.Status.Allocation.Devices.Results[0].ShareID)
	cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(e.t, cur, share, api.ShareUsage{
		From: t0.Add(time.Duration(i-1)*5*time.Minute + time.Second), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
		MemoryMaxBytes: 8 << 30, SMSamples: smSamples, SMMaxPercent: smMax})}
	if _, err := e.client.ResourceV1().ResourceClaims("team-a").UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.settle()
	cached, err := e.c.claims.ResourceClaims("team-a").Get(claimName)
	if err != nil {
		e.t.Fatal(err)
	}
	e.c.idle.observeIdle(cached)
}

func (e *idleEnv) web() *appsv1.Deployment {
	e.t.Helper()
	d, err := e.client.AppsV1().Deployments("team-a").Get(e.ctx, "web", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *idleEnv) events(reason string) []string {
	var out []string
	for {
		select {
		case ev := <-e.rec.Events:
			if strings.Contains(ev, reason) {
				out = append(out, ev)
			}
		default:
			return out
		}
	}
}

var optIn = map[string]string{api.AnnotationIdleScaleDown: "true"}

// An opted-in Deployment whose every claim reported no SM activity for the policy's 10
// minutes is scaled to zero, with its replicas and reserve recorded and an event; not
// before, and not while one claim is busy.
func TestIdleScaleDownScalesIdleDeployment(t *testing.T) {
	e := newIdleEnv(t, deployment("team-a", "web", 2, optIn))
	e.report("web-a-gpu", 1, 0, 30)
	e.report("web-b-gpu", 1, 0, 30)
	e.report("web-a-gpu", 2, 0, 30)
	e.report("web-b-gpu", 2, 0, 30)
	e.c.idle.scaleIdle(e.ctx)
	if r := *e.web().Spec.Replicas; r != 2 {
		t.Fatalf("scaled to %d after 9m59s of idle reports; want 10m first", r)
	}
	e.report("web-a-gpu", 3, 0, 30)
	e.report("web-b-gpu", 3, 60, 30) // busy again
	e.c.idle.scaleIdle(e.ctx)
	if r := *e.web().Spec.Replicas; r != 2 {
		t.Fatalf("scaled to %d while web-b was busy", r)
	}
	for i := 4; i <= 6; i++ {
		e.report("web-a-gpu", i, 0, 30)
		e.report("web-b-gpu", i, 0, 30)
	}
	e.c.idle.scaleIdle(e.ctx)
	web := e.web()
	if r := *web.Spec.Replicas; r != 0 {
		t.Fatalf("replicas %d after both claims idled 14m59s; want 0", r)
	}
	if got := web.Annotations[api.AnnotationScaledDownReplicas]; got != "2" {
		t.Errorf("scaled-down-replicas %q; want 2", got)
	}
	if got := reserveOf(web, ptr.To[int32](0)); got != (model.Usage{Mem: 20 << 30, Comp: 40}) {
		t.Errorf("reserve %+v (annotation %q); want 20Gi and 40%%", got, web.Annotations[api.AnnotationScaledDownReserve])
	}
	if ev := e.events(ReasonScaledToZero); len(ev) != 1 || !strings.Contains(ev[0], "from 2 replicas to zero") {
		t.Errorf("events %q; want one %s", ev, ReasonScaledToZero)
	}
}

// Reports without SM samples never count as idle, and a workload its owner did not opt in
// is never scaled, however idle.
func TestIdleScaleDownNeedsSMSamplesAndOptIn(t *testing.T) {
	for name, tc := range map[string]struct {
		web       *appsv1.Deployment
		smSamples int
	}{
		"no SM samples": {deployment("team-a", "web", 2, optIn), 0},
		"not opted in":  {deployment("team-a", "web", 2, nil), 30},
		"opt-in false":  {deployment("team-a", "web", 2, map[string]string{api.AnnotationIdleScaleDown: "false"}), 30},
	} {
		t.Run(name, func(t *testing.T) {
			e := newIdleEnv(t, tc.web)
			for i := 1; i <= 6; i++ {
				e.report("web-a-gpu", i, 0, tc.smSamples)
				e.report("web-b-gpu", i, 0, tc.smSamples)
			}
			e.c.idle.scaleIdle(e.ctx)
			if r := *e.web().Spec.Replicas; r != 2 {
				t.Fatalf("scaled to %d", r)
			}
		})
	}
}

// The allocator scales nothing while it may not write (a standby or fenced allocator).
func TestIdleScaleDownFenced(t *testing.T) {
	e := newIdleEnv(t, deployment("team-a", "web", 2, optIn))
	e.c.cfg.Fence = denyFence{}
	for i := 1; i <= 3; i++ {
		e.report("web-a-gpu", i, 0, 30)
		e.report("web-b-gpu", i, 0, 30)
	}
	e.c.idle.scaleIdle(e.ctx)
	if r := *e.web().Spec.Replicas; r != 2 {
		t.Fatalf("a fenced allocator scaled to %d", r)
	}
}

// Once the workload has replicas again, whoever scaled it, the allocator drops the
// annotations and its reserve no longer counts.
func TestIdleScaleDownDropsAnnotationsWhenWoken(t *testing.T) {
	e := newIdleEnv(t, deployment("team-a", "web", 3, map[string]string{
		api.AnnotationScaledDownReplicas: "3", api.AnnotationScaledDownReserve: `{"memory":"20Gi","compute":40}`, "keep": "me"}))
	e.c.idle.scaleIdle(e.ctx)
	a := e.web().Annotations
	if _, ok := a[api.AnnotationScaledDownReplicas]; ok || a[api.AnnotationScaledDownReserve] != "" || a["keep"] != "me" {
		t.Fatalf("annotations %v after waking; want only keep", a)
	}
}

type denyFence struct{}

func (denyFence) Allow() error { return errors.New("not the leader") }

// waitWorkload waits until the allocator's cache shows web of ns with replicas.
func (e *env) waitWorkload(ns string, replicas int32) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if d, err := e.c.deployments.Deployments(ns).Get("web"); err == nil && *d.Spec.Replicas == replicas {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.t.Fatalf("the cache never showed %s/web with %d replicas", ns, replicas)
}

func reserveAnnotations(memory string, compute int) map[string]string {
	return map[string]string{api.AnnotationScaledDownReplicas: "1",
		api.AnnotationScaledDownReserve: `{"memory":"` + memory + `","compute":` + strconv.Itoa(compute) + `}`}
}

// A workload scaled to zero keeps its reserve of its own namespace's quota: the namespace's
// other claims cannot take it, another namespace's quota is untouched, and once the workload
// has replicas again the quota is free.
func TestIdleReserveHoldsOwnNamespaceQuota(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("40Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		deployment("team-a", "web", 0, reserveAnnotations("30Gi", 40)),
		builders.MakeClaim("team-a", "small").Memory("10Gi").Created(0).Obj(), builders.MakePod("team-a", "small").Claim("small").Obj(),
		builders.MakeClaim("team-a", "next").Memory("10Gi").Created(1).Obj(), builders.MakePod("team-a", "next").Claim("next").Obj(),
		builders.MakeClaim("team-b", "other").Memory("40Gi").Created(2).Obj(), builders.MakePod("team-b", "other").Claim("other").Obj())
	e.waitWorkload("team-a", 0)
	e.run()
	if e.placedOn("team-a", "small") == "" {
		t.Fatalf("small (10Gi next to a 30Gi reserve, 40Gi quota) not placed: %s", e.claim("team-a", "small").Annotations[api.AnnotationStatus])
	}
	if e.placedOn("team-a", "next") != "" {
		t.Fatal("next placed into the quota that web, scaled to zero, keeps")
	}
	if st := e.claim("team-a", "next").Annotations[api.AnnotationStatus]; !strings.Contains(st, "40Gi in use (30Gi of it kept for workloads scaled to zero)") {
		t.Errorf("next's status %q does not say the reserve holds the quota", st)
	}
	if e.placedOn("team-b", "other") == "" {
		t.Fatalf("team-a's reserve held team-b's claim: %s", e.claim("team-b", "other").Annotations[api.AnnotationStatus])
	}
	web := deployment("team-a", "web", 1, reserveAnnotations("30Gi", 40))
	if _, err := e.client.AppsV1().Deployments("team-a").Update(e.ctx, web, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitWorkload("team-a", 1)
	e.run()
	if e.placedOn("team-a", "next") == "" {
		t.Fatalf("next still waits once web has replicas again: %s", e.claim("team-a", "next").Annotations[api.AnnotationStatus])
	}
}

// The reserve annotation is the tenant's to write: a negative or unreadable one frees no
// quota, a huge one binds only its own namespace, and none lets a claim past the quota.
func TestIdleReserveCannotRaiseQuota(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("40Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		deployment("team-a", "web", 0, reserveAnnotations("-100Gi", -100)),
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "db", Annotations: map[string]string{api.AnnotationScaledDownReserve: "not json"}},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0)}},
		deployment("team-b", "web", 0, reserveAnnotations("1Ti", 1000)),
		builders.MakeClaim("team-a", "big").Memory("50Gi").Created(0).Obj(), builders.MakePod("team-a", "big").Claim("big").Obj(),
		builders.MakeClaim("team-a", "full").Memory("40Gi").Created(1).Obj(), builders.MakePod("team-a", "full").Claim("full").Obj(),
		builders.MakeClaim("team-a", "more").Memory("10Gi").Created(2).Obj(), builders.MakePod("team-a", "more").Claim("more").Obj(),
		builders.MakeClaim("team-c", "c").Memory("40Gi").Created(3).Obj(), builders.MakePod("team-c", "c").Claim("c").Obj())
	e.waitWorkload("team-a", 0)
	e.waitWorkload("team-b", 0)
	e.run()
	e.checkWithinQuota("team-a", "40Gi")
	if st := e.claim("team-a", "big").Annotations[api.AnnotationStatus]; e.placedOn("team-a", "big") != "" || !strings.Contains(st, "unless the quota is raised") {
		t.Fatalf("big (50Gi, quota 40Gi) placed or not refused: %q", st)
	}
	if e.placedOn("team-a", "full") == "" {
		t.Fatalf("full not placed: %s", e.claim("team-a", "full").Annotations[api.AnnotationStatus])
	}
	if e.placedOn("team-a", "more") != "" {
		t.Fatal("a negative reserve let more past team-a's 40Gi quota")
	}
	if e.placedOn("team-c", "c") == "" {
		t.Fatalf("team-b's 1Ti reserve held team-c's claim: %s", e.claim("team-c", "c").Annotations[api.AnnotationStatus])
	}
}

// A reserve near MaxInt64 (the tenant can write one) must not wrap the quota check around
// and switch the namespace's quota off: with it, nothing more of the namespace fits.
func TestIdleReserveOverflowKeepsQuota(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("40Gi").QuotaCompute(100).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		deployment("team-a", "web", 0, reserveAnnotations("9223372036854775807", math.MaxInt64)),
		deployment("team-b", "web", 0, reserveAnnotations("9223372036854775807", math.MaxInt64)),
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "db", Annotations: reserveAnnotations("9223372036854775807", math.MaxInt64)},
			Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0)}},
		builders.MakeClaim("team-a", "c1").Memory("30Gi").Compute("10").Created(0).Obj(), builders.MakePod("team-a", "c1").Claim("c1").Obj(),
		builders.MakeClaim("team-a", "c2").Memory("30Gi").Compute("10").Created(1).Obj(), builders.MakePod("team-a", "c2").Claim("c2").Obj(),
		builders.MakeClaim("team-b", "c3").Memory("10Gi").Compute("10").Created(2).Obj(), builders.MakePod("team-b", "c3").Claim("c3").Obj())
	e.waitWorkload("team-a", 0)
	e.waitWorkload("team-b", 0)
	e.run()
	// c2 waits behind c1 in team-a's quota queue; the others say what holds them.
	for _, c := range []struct{ ns, name string }{{"team-a", "c1"}, {"team-a", "c2"}, {"team-b", "c3"}} {
		if e.placedOn(c.ns, c.name) != "" {
			t.Errorf("%s/%s placed next to a MaxInt64 reserve under a 40Gi, 100%% quota", c.ns, c.name)
		}
		if st := e.claim(c.ns, c.name).Annotations[api.AnnotationStatus]; c.name != "c2" && !strings.Contains(st, "kept for workloads scaled to zero") {
			t.Errorf("%s/%s: status %q does not say the reserve holds the quota", c.ns, c.name, st)
		}
	}
}

// overBy never overflows, whatever a tenant's reserve adds to the usage.
func TestOverBy(t *testing.T) {
	for _, c := range []struct{ used, need, limit, want int64 }{
		{0, 10, 40, -30},
		{30, 10, 40, 0},
		{35, 10, 40, 5},
		{math.MaxInt64, 1, 40, 1},
		{addSat(math.MaxInt64, math.MaxInt64), 30 << 30, 40 << 30, 30 << 30},
	} {
		if got := overBy(c.used, c.need, c.limit); got != c.want {
			t.Errorf("overBy(%d, %d, %d) = %d; want %d", c.used, c.need, c.limit, got, c.want)
		}
	}
}

// A bursting share reserves what the quota charges it, its cap, when its workload is
// scaled to zero: waking it needs that much again.
func TestIdleReserveOfABurstingShareIsItsCap(t *testing.T) {
	a, pa := idleClaim("web-a", 10)
	raw := `{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig","mode":"mps","placement":{"latencyClass":"bestEffort","memoryLimit":"30Gi"}}`
	a.Status.Allocation.Devices.Config = append(a.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}})
	b, pb := idleClaim("web-b", 10)
	e := &idleEnv{newEnv(t, []*api.SharingPolicy{builders.MakePolicy("idle").IdleScaleDown(10 * time.Minute).Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), a, pa, b, pb, deployment("team-a", "web", 2, optIn))}
	for i := 1; i <= 3; i++ {
		e.report("web-a-gpu", i, 0, 30)
		e.report("web-b-gpu", i, 0, 30)
	}
	e.c.idle.scaleIdle(e.ctx)
	web := e.web()
	if got := reserveOf(web, ptr.To[int32](0)); got != (model.Usage{Mem: 40 << 30, Comp: 40}) {
		t.Errorf("reserve %+v (annotation %q); want 40Gi (web-a's 30Gi cap and web-b's 10Gi) and 40%%", got, web.Annotations[api.AnnotationScaledDownReserve])
	}
}
