package controller

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// The spread charge: the whole of every GPU a namespace has to itself beyond as many as its
// shares need; shares that cannot be packed tighter pay nothing.
func TestSpreadCharge(t *testing.T) {
	share := func(claim string, mem int64, comp int64) *tenant {
		return &tenant{claim: types.UID(claim), mem: mem, comp: comp, allowShare: true, mode: api.SharingModeMPS}
	}
	on := func(shares ...*tenant) spreadGPU {
		return spreadGPU{memCap: 80 * gi, compCap: 100, shares: shares}
	}
	limited := func(s *tenant, maxTenants int) *tenant { s.maxTenants = maxTenants; return s }
	critical := func(s *tenant, maxCo int) *tenant { s.latency, s.maxCo = api.LatencyCritical, maxCo; return s }
	for name, tc := range map[string]struct {
		gpus []spreadGPU
		want usage
	}{
		"one GPU":                        {[]spreadGPU{on(share("a", gi, 0))}, usage{}},
		"one small share on each of two": {[]spreadGPU{on(share("a", gi, 0)), on(share("b", 2*gi, 0))}, usage{80 * gi, 100}},
		"one on each of three":           {[]spreadGPU{on(share("a", gi, 10)), on(share("b", gi, 10)), on(share("c", gi, 20))}, usage{160 * gi, 200}},
		"shares that do not fit one":     {[]spreadGPU{on(share("a", 50*gi, 0)), on(share("b", 50*gi, 0))}, usage{}},
		"compute that does not fit one":  {[]spreadGPU{on(share("a", gi, 60)), on(share("b", gi, 60))}, usage{}},
		"one claim's two devices":        {[]spreadGPU{on(share("a", gi, 0)), on(share("a", gi, 0))}, usage{}},
		"one tenant per GPU":             {[]spreadGPU{on(limited(share("a", gi, 0), 1)), on(share("b", gi, 0))}, usage{}},
		"a critical share alone":         {[]spreadGPU{on(critical(share("a", gi, 0), 0)), on(share("b", gi, 0))}, usage{}},
		"three on three that need two":   {[]spreadGPU{on(share("a", 50*gi, 0)), on(share("b", 50*gi, 0)), on(share("c", gi, 0))}, usage{80 * gi, 100}},
		"one GPU's worth and a little":   {[]spreadGPU{on(share("a", 79*gi, 0), share("b", 1*gi, 0)), on(share("c", gi, 0))}, usage{}},
	} {
		if got := spreadCharge(tc.gpus); got != tc.want {
			t.Errorf("%s: charge %v, want %v", name, got, tc.want)
		}
	}
}

// pinned is a claim of namespace ns pinned to the GPU of the given index by its selector.
func pinned(ns, name, mem string, index string, created int) *resourceapi.ResourceClaim {
	c := builders.MakeClaim(ns, name).Memory(mem).Created(created).Obj()
	c.Spec.Devices.Requests[0].Exactly.Selectors = celSelector(`device.attributes["gpu.fgpu.dev"].index == ` + index)
	return c
}

// A namespace that may share GPUs pins one small share to each GPU: every GPU it is alone on
// is closed to whole-GPU claims. Its second GPU's room counts against its quota, so the pinned
// claim waits, saying why, while an unpinned one joins the first; once another namespace's
// share is on the second GPU, the pinned claim keeps no one off and is placed there.
func TestPinnedSharesPayForTheGPUsTheyHoldAlone(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("shared").Isolation(api.IsolationNone).Obj(),
		builders.MakePolicy("q").Namespaces("kubernetes.io/metadata.name", "a").Isolation(api.IsolationNone).QuotaMemory("20Gi").Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("a"), namespaceObj("b"),
		pinned("a", "p0", "1Gi", "0", 0), builders.MakePod("a", "p0").Claim("p0").Obj(),
		pinned("a", "p1", "1Gi", "1", 1), builders.MakePod("a", "p1").Claim("p1").Obj(),
		builders.MakeClaim("a", "free").Memory("1Gi").Created(2).Obj(), builders.MakePod("a", "free").Claim("free").Obj())
	e.run()
	if got := e.placedOn("a", "p0"); got != "n1/gpu-0" {
		t.Fatalf("p0 on %q: %s", got, e.claim("a", "p0").Annotations[api.AnnotationStatus])
	}
	if got := e.placedOn("a", "p1"); got != "" {
		t.Errorf("p1 placed on %s: its namespace would be alone on both GPUs for 2Gi of a 20Gi quota", got)
	}
	if st := e.claim("a", "p1").Annotations[api.AnnotationStatus]; !strings.Contains(st, reasonOverQuotaHeld) || !strings.Contains(st, "over its 20Gi quota") {
		t.Errorf("status of p1 %q does not say %q", st, reasonOverQuotaHeld)
	}
	if got := e.placedOn("a", "free"); got != "n1/gpu-0" {
		t.Errorf("an unpinned claim on %q, want next to its namespace's share on n1/gpu-0", got)
	}
	e.create(pinned("b", "other", "1Gi", "1", 3), builders.MakePod("b", "other").Claim("other").Obj())
	e.run()
	if got := e.placedOn("b", "other"); got != "n1/gpu-1" {
		t.Fatalf("b/other on %q: %s", got, e.claim("b", "other").Annotations[api.AnnotationStatus])
	}
	if got := e.placedOn("a", "p1"); got != "n1/gpu-1" {
		t.Errorf("p1 on %q once another namespace shares gpu-1: %s", got, e.claim("a", "p1").Annotations[api.AnnotationStatus])
	}
}

// The charge follows the state, not the way to it: a large share opens a second GPU (it
// does not fit beside the first share), a small one joins it, the large one goes. The
// namespace is then alone on two GPUs with shares that fit one, and pays for one whole GPU,
// so it cannot pin a share to a third; another namespace joining the first ends that.
func TestOpeningWithALargeShareAndLeavingIsCharged(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("shared").Isolation(api.IsolationNone).Obj(),
		builders.MakePolicy("q").Namespaces("kubernetes.io/metadata.name", "a").Isolation(api.IsolationNone).QuotaMemory("100Gi").Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 3, "80Gi"), namespaceObj("a"), namespaceObj("b"),
		pinned("a", "first", "1Gi", "0", 0), builders.MakePod("a", "first").Claim("first").Obj(),
		builders.MakeClaim("a", "large").Memory("81408Mi").Created(1).Obj(), builders.MakePod("a", "large").Claim("large").Obj())
	e.run()
	if got := e.placedOn("a", "first"); got != "n1/gpu-0" {
		t.Fatalf("first on %q: %s", got, e.claim("a", "first").Annotations[api.AnnotationStatus])
	}
	large := e.placedOn("a", "large")
	if large == "" || large == "n1/gpu-0" {
		t.Fatalf("large on %q: %s", large, e.claim("a", "large").Annotations[api.AnnotationStatus])
	}
	e.create(pinned("a", "small", "512Mi", strings.TrimPrefix(large, "n1/gpu-"), 2), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	if got := e.placedOn("a", "small"); got != large {
		t.Fatalf("small on %q, want %s: %s", got, large, e.claim("a", "small").Annotations[api.AnnotationStatus])
	}
	charge := func() usage {
		e.c.model.mu.Lock()
		defer e.c.model.mu.Unlock()
		return e.c.model.held("a").charge()
	}
	if got := charge(); got != (usage{}) {
		t.Errorf("charged %v while the shares need both GPUs", got)
	}
	for _, del := range []func() error{
		func() error { return e.client.CoreV1().Pods("a").Delete(e.ctx, "large", metav1.DeleteOptions{}) },
		func() error {
			return e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "large", metav1.DeleteOptions{})
		},
	} {
		if err := del(); err != nil {
			t.Fatal(err)
		}
	}
	e.run()
	if got, want := charge(), (usage{80 * gi, 100}); got != want {
		t.Errorf("charged %v once the large share left, want one whole GPU %v", got, want)
	}
	third := map[string]string{"n1/gpu-0": "", large: ""}
	for _, i := range []string{"0", "1", "2"} {
		if _, taken := third["n1/gpu-"+i]; !taken {
			e.create(pinned("a", "again", "1Gi", i, 3), builders.MakePod("a", "again").Claim("again").Obj())
		}
	}
	e.run()
	if got := e.placedOn("a", "again"); got != "" {
		t.Errorf("a third pinned share placed on %s beside two GPUs its namespace has to itself", got)
	}
	if st := e.claim("a", "again").Annotations[api.AnnotationStatus]; !strings.Contains(st, reasonOverQuotaHeld) {
		t.Errorf("status of again %q does not say %q", st, reasonOverQuotaHeld)
	}
	e.create(pinned("b", "other", "1Gi", "0", 4), builders.MakePod("b", "other").Claim("other").Obj())
	e.run()
	if got := e.placedOn("a", "again"); got == "" {
		t.Errorf("again not placed once another namespace shares the first GPU: %s", e.claim("a", "again").Annotations[api.AnnotationStatus])
	}
	if got, want := charge(), (usage{80 * gi, 100}); got != want {
		t.Errorf("charged %v alone on two GPUs that one would do, want one whole GPU %v", got, want)
	}
}

// Under heldRoom: Refuse a namespace that may share GPUs still grows onto a second GPU when
// its shares no longer fit one; what it may not do is pin a small share to a GPU of its own.
func TestRefusedHeldRoomLetsSharesOutgrowAGPU(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("shared").Isolation(api.IsolationNone).Obj(),
		builders.MakePolicy("kueue-owns-a").Namespaces("kubernetes.io/metadata.name", "a").Isolation(api.IsolationNone).RefuseHeldRoom().Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 3, "80Gi"), namespaceObj("a"),
		builders.MakeClaim("a", "s0").Memory("50Gi").Created(0).Obj(), builders.MakePod("a", "s0").Claim("s0").Obj(),
		builders.MakeClaim("a", "s1").Memory("50Gi").Created(1).Obj(), builders.MakePod("a", "s1").Claim("s1").Obj())
	e.run()
	s0, s1 := e.placedOn("a", "s0"), e.placedOn("a", "s1")
	if s0 == "" || s1 == "" || s0 == s1 {
		t.Fatalf("two 50Gi shares on %q and %q: %s", s0, s1, e.claim("a", "s1").Annotations[api.AnnotationStatus])
	}
	free := "3"
	for _, i := range []string{"0", "1", "2"} {
		if s0 != "n1/gpu-"+i && s1 != "n1/gpu-"+i {
			free = i
		}
	}
	e.create(pinned("a", "pin", "1Gi", free, 2), builders.MakePod("a", "pin").Claim("pin").Obj())
	e.run()
	if got := e.placedOn("a", "pin"); got != "" {
		t.Errorf("a pinned 1Gi share placed on %s, a third GPU its namespace would have to itself", got)
	}
	if st := e.claim("a", "pin").Annotations[api.AnnotationStatus]; !strings.Contains(st, reasonHeldRoomRefused) {
		t.Errorf("status of pin %q does not say %q", st, reasonHeldRoomRefused)
	}
}

// BenchmarkSpreadCharge times the spread charge of a namespace alone on n GPUs, one share on
// each that no other fits beside (the packing's worst case: every share tries every GPU
// opened before it), as quotaFits projects it for one more GPU.
func BenchmarkSpreadCharge(b *testing.B) {
	for _, n := range []int{8, 100, 1000} {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			gpus := make([]spreadGPU, n)
			for i := range gpus {
				gpus[i] = spreadGPU{memCap: 80 * gi, compCap: 100, shares: []*tenant{{claim: types.UID(fmt.Sprint(i)), mem: 41 * gi}}}
			}
			b.ResetTimer()
			for range b.N {
				if spreadCharge(gpus) != (usage{}) {
					b.Fatal("charged shares that need their GPUs")
				}
			}
		})
	}
}
