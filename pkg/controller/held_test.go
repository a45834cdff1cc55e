package controller

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

func subDomainClaim(name, domain string, created int) []runtime.Object {
	return []runtime.Object{builders.MakeClaim("a", name).Memory("256Mi").Config(map[string]any{"isolationDomain": domain}).Created(created).Obj(),
		builders.MakePod("a", name).Claim(name).Obj()}
}

// Finding 3 of issue #24: four 256Mi claims in four isolation sub-domains held four whole
// GPUs under a 2Gi quota. A sub-domain keeps every other domain off its GPU, so a second one
// pays for the room it keeps: over the quota, it waits, saying why; claims of a domain that
// already holds a GPU go there at no extra charge; once the first domain leaves, the
// second is placed.
func TestSubDomainsPayForTheGPUsTheyHold(t *testing.T) {
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi")}
	objs = append(objs, subDomainClaim("d0", "d0", 0)...)
	objs = append(objs, subDomainClaim("d1", "d1", 1)...)
	objs = append(objs, subDomainClaim("d0b", "d0", 2)...)
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").QuotaMemory("2Gi").Obj()}, objs...)
	e.run()
	first := e.placedOn("a", "d0")
	if first == "" || e.placedOn("a", "d0b") != first {
		t.Fatalf("the first domain's claims on %q and %q, want one GPU", first, e.placedOn("a", "d0b"))
	}
	if got := e.placedOn("a", "d1"); got != "" {
		t.Fatalf("a second sub-domain took %s for 256Mi of a 2Gi quota", got)
	}
	st := e.claim("a", "d1").Annotations[api.AnnotationStatus]
	for _, want := range []string{reasonOverQuotaHeld, "n1/gpu-", "more free from others, over its 2Gi quota", "isolation"} {
		if !strings.Contains(st, want) {
			t.Errorf("status of d1 %q does not say %q", st, want)
		}
	}
	var charged model.Usage
	e.c.model.Update(func(tx *model.Tx) { charged = tx.Held("a").Charge() })
	if charged != (model.Usage{}) {
		t.Errorf("one GPU held, charged %v for its room", charged)
	}
	if u := e.c.model.ByNamespace()["a"]; u.Charged != 512<<20 {
		t.Errorf("quota used %d, want 512Mi", u.Charged)
	}
	for _, name := range []string{"d0", "d0b"} {
		_ = e.client.CoreV1().Pods("a").Delete(e.ctx, name, metav1.DeleteOptions{})
		_ = e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, name, metav1.DeleteOptions{})
	}
	e.run()
	if got := e.placedOn("a", "d1"); got == "" {
		t.Errorf("d1 not placed once the other domain left: %s", e.claim("a", "d1").Annotations[api.AnnotationStatus])
	}
}

// Finding 3 of issue #24: time-sliced claims kept every other namespace's MPS claims off the
// GPUs they were on, for 1Gi of quota. A time-sliced claim of two GPUs keeps the room of
// both: beyond a 10Gi quota, it is refused at once, and another namespace's MPS claim gets
// the GPU the tenant's time-sliced claims leave alone.
func TestTimeSlicedClaimsPayForTheRoomTheyKeep(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("shared").Isolation(api.IsolationNone).Obj(),
		builders.MakePolicy("q").Namespaces("kubernetes.io/metadata.name", "a").QuotaMemory("10Gi").Obj(),
	}
	ts := map[string]any{"mode": "timeSlicing"}
	pair := builders.MakeClaim("a", "pair").Memory("512Mi").Config(ts).Created(1).Obj()
	pair.Spec.Devices.Requests[0].Exactly.Count = 2
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("a"), namespaceObj("b"),
		builders.MakeClaim("a", "ts").Memory("1Gi").Config(ts).Obj(), builders.MakePod("a", "ts").Claim("ts").Obj(),
		pair, builders.MakePod("a", "pair").Claim("pair").Obj())
	e.run()
	sliced := e.placedOn("a", "ts")
	if sliced == "" {
		t.Fatalf("ts not placed: %s", e.claim("a", "ts").Annotations[api.AnnotationStatus])
	}
	e.refusedForQuota("a", "pair", "larger than the GPU quota of namespace a", "devices would keep", "free from other namespaces on every GPU but one")
	e.create(builders.MakeClaim("b", "mps").Memory("10Gi").Created(2).Obj(), builders.MakePod("b", "mps").Claim("mps").Obj())
	e.run()
	if got := e.placedOn("b", "mps"); got == "" || got == sliced {
		t.Errorf("another namespace's MPS claim on %q (the time-sliced GPU is %s): %s", got, sliced, e.claim("b", "mps").Annotations[api.AnnotationStatus])
	}
}

// Issue #24: where Kueue owns a namespace's quota it charges what the claims ask, not the
// room they keep; quota.heldRoom: Refuse makes fgpu's placement agree. The namespace's
// time-sliced claims are packed onto the GPU it already keeps; a second sub-domain, which
// would keep another GPU, waits, saying why, with no memory or compute quota at all; a
// claim of two time-sliced devices is never placed across two GPUs; another namespace gets
// the GPU left alone; once the first domain leaves, the second is placed.
func TestRefusedHeldRoomKeepsANamespaceToOneGPU(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("shared").Isolation(api.IsolationNone).Obj(),
		builders.MakePolicy("kueue-owns-a").Namespaces("kubernetes.io/metadata.name", "a").RefuseHeldRoom().Obj(),
	}
	ts := map[string]any{"mode": "timeSlicing"}
	pair := builders.MakeClaim("a", "pair").Memory("512Mi").Config(ts).Created(3).Obj()
	pair.Spec.Devices.Requests[0].Exactly.Count = 2
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("a"), namespaceObj("b"),
		builders.MakeClaim("a", "ts0").Memory("1Gi").Config(ts).Created(0).Obj(), builders.MakePod("a", "ts0").Claim("ts0").Obj(),
		builders.MakeClaim("a", "ts1").Memory("1Gi").Config(ts).Created(1).Obj(), builders.MakePod("a", "ts1").Claim("ts1").Obj(),
		builders.MakeClaim("a", "ts2").Memory("1Gi").Config(ts).Created(2).Obj(), builders.MakePod("a", "ts2").Claim("ts2").Obj(),
		pair, builders.MakePod("a", "pair").Claim("pair").Obj())
	e.run()
	sliced := e.placedOn("a", "ts0")
	if sliced == "" {
		t.Fatalf("ts0 not placed: %s", e.claim("a", "ts0").Annotations[api.AnnotationStatus])
	}
	for _, name := range []string{"ts1", "ts2"} {
		if got := e.placedOn("a", name); got != sliced {
			t.Errorf("%s on %q, want packed onto %s, the GPU its namespace keeps: %s", name, got, sliced, e.claim("a", name).Annotations[api.AnnotationStatus])
		}
	}
	if got := e.placedOn("a", "pair"); got != "" {
		t.Errorf("a two-device time-sliced claim placed on %s: it keeps a second GPU", got)
	}
	st := e.claim("a", "pair").Annotations[api.AnnotationStatus]
	for _, want := range []string{reasonHeldRoomRefused, "SharingPolicy kueue-owns-a"} {
		if !strings.Contains(st, want) {
			t.Errorf("status of pair %q does not say %q", st, want)
		}
	}
	var charged model.Usage
	e.c.model.Update(func(tx *model.Tx) { charged = tx.Held("a").Charge() })
	if charged != (model.Usage{}) {
		t.Errorf("room kept beyond one GPU: %v", charged)
	}
	e.create(builders.MakeClaim("b", "mps").Memory("10Gi").Created(4).Obj(), builders.MakePod("b", "mps").Claim("mps").Obj())
	e.create(subDomainClaim("d1", "d1", 5)...)
	e.run()
	if got := e.placedOn("b", "mps"); got == "" || got == sliced {
		t.Errorf("another namespace's MPS claim on %q (the time-sliced GPU is %s): %s", got, sliced, e.claim("b", "mps").Annotations[api.AnnotationStatus])
	}
	if got := e.placedOn("a", "d1"); got != "" {
		t.Fatalf("a sub-domain claim took %s beside the time-sliced GPU %s", got, sliced)
	}
	if st := e.claim("a", "d1").Annotations[api.AnnotationStatus]; !strings.Contains(st, reasonHeldRoomRefused) {
		t.Errorf("status of d1 %q does not say %q", st, reasonHeldRoomRefused)
	}
	for _, name := range []string{"ts0", "ts1", "ts2", "pair"} {
		_ = e.client.CoreV1().Pods("a").Delete(e.ctx, name, metav1.DeleteOptions{})
		_ = e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, name, metav1.DeleteOptions{})
	}
	e.run()
	if got := e.placedOn("a", "d1"); got == "" {
		t.Errorf("d1 not placed once the time-sliced claims left: %s", e.claim("a", "d1").Annotations[api.AnnotationStatus])
	}
}

// A claim turned down for quota on the GPUs it was asked about, and by the placement core
// on a node its pod does not fit, waits for that node as much as for quota: it must not hold
// its namespace's quota queue. Its namespace keeps n1's GPU (namespace isolation); its second
// pod's CPU fits only n2, where the room kept on n1 would put it over quota. The younger
// claim, whose pod fits n1, is placed beside the first.
func TestClaimWaitingForANodeToo(t *testing.T) {
	pols := []*api.SharingPolicy{builders.MakePolicy("q").Namespaces("kubernetes.io/metadata.name", "a").QuotaMemory("40Gi").Obj()}
	e := newEnv(t, pols, builders.MakeNode("n1").CPU("4").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
		builders.MakeNode("n2").CPU("16").Obj(), builders.MakeSlice("n2", 1, "80Gi"), namespaceObj("a"),
		builders.MakeClaim("a", "first").Memory("10Gi").Created(0).Obj(), builders.MakePod("a", "first").Claim("first").CPU("3").Obj())
	e.run()
	first := e.placedOn("a", "first")
	if first != "n1/gpu-0" {
		t.Fatalf("first on %q, want n1/gpu-0 (the best fit for its CPU): %s", first, e.claim("a", "first").Annotations[api.AnnotationStatus])
	}
	e.create(builders.MakeClaim("a", "wide").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "wide").Claim("wide").CPU("8").Obj(),
		builders.MakeClaim("a", "narrow").Memory("10Gi").Created(2).Obj(), builders.MakePod("a", "narrow").Claim("narrow").CPU("500m").Obj())
	e.run()
	if got := e.placedOn("a", "wide"); got != "" {
		t.Fatalf("wide placed on %s: with n1's room kept it is over quota on n2", got)
	}
	if got := e.placedOn("a", "narrow"); got != first {
		t.Errorf("narrow on %q, want %s beside first: %s", got, first, e.claim("a", "narrow").Annotations[api.AnnotationStatus])
	}
}
