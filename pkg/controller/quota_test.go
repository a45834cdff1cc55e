package controller

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// wholeGPUs is a claim for count whole GPUs of the exclusive class.
func wholeGPUs(ns, name string, count int64, created int) *resourceapi.ResourceClaim {
	c := builders.MakeClaim(ns, name).Class(api.DeviceClassExclusive).Created(created).Obj()
	c.Spec.Devices.Requests[0].Exactly.Count = count
	return c
}

// withWholeGPU adds a request "gpu2" for one whole GPU to a claim.
func withWholeGPU(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, resourceapi.DeviceRequest{Name: "gpu2",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}})
	return c
}

// nsMemory is the GPU memory the claims of a namespace hold, from the API server.
func (e *env) nsMemory(ns string) resource.Quantity {
	e.t.Helper()
	list, err := e.client.ResourceV1().ResourceClaims(ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	var sum resource.Quantity
	for _, c := range list.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			sum.Add(r.ConsumedCapacity[api.CapacityMemory])
		}
	}
	return sum
}

func (e *env) checkWithinQuota(ns, quota string) {
	e.t.Helper()
	if used := e.nsMemory(ns); used.Cmp(resource.MustParse(quota)) > 0 {
		e.t.Fatalf("namespace %s holds %s, over its %s quota", ns, used.String(), quota)
	}
}

// setQuotaMemory changes a SharingPolicy's memory quota and waits for the allocator to see it.
func (e *env) setQuotaMemory(policy, q string) {
	e.t.Helper()
	p, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Get(e.ctx, policy, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	m := resource.MustParse(q)
	p.Spec.Quota.Memory = &m
	if _, err := e.fgpu.FgpuV1alpha1().SharingPolicies().Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
		if got, err := e.c.policies.Get(policy); err == nil && got.Spec.Quota.Memory.Cmp(m) == 0 {
			return
		}
	}
	e.t.Fatal("the allocator did not see the new quota")
}

// refusedForQuota checks that a claim is pending with a message that says it exceeds the
// quota on its own, without promising it a place when quota frees up.
func (e *env) refusedForQuota(ns, name string, want ...string) {
	e.t.Helper()
	if e.placedOn(ns, name) != "" {
		e.t.Fatalf("%s placed though it is larger than the quota", name)
	}
	st := e.claim(ns, name).Annotations[api.AnnotationStatus]
	for _, w := range append(want, "unless the quota is raised") {
		if !strings.Contains(st, w) {
			e.t.Errorf("status of %s %q does not say %q", name, st, w)
		}
	}
	if strings.Contains(st, "frees up") {
		e.t.Errorf("status of %s %q promises a place when quota frees up", name, st)
	}
	if ev := e.events(ReasonOverQuota + " claim " + name + ": Pending: larger than"); len(ev) == 0 {
		e.t.Errorf("no %s event on the pod of %s", ReasonOverQuota, name)
	}
	if ahead, ok := e.c.pending.QuotaAhead(ns, ns+"/younger", builders.Created.Add(time.Hour)); ok {
		e.t.Errorf("%s holds the quota queue of %s", ahead, ns)
	}
}

// Whole GPUs count against the quota: 4 × 80Gi must not pass an 80Gi quota, and a claim
// that asks for them must not hold the claims behind it.
func TestQuotaCountsWholeGPUs(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("80Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		wholeGPUs("a", "four", 4, 0), builders.MakePod("a", "four").Claim("four").Obj(),
		wholeGPUs("a", "one", 1, 1), builders.MakePod("a", "one").Claim("one").Obj())
	e.run()
	e.checkWithinQuota("a", "80Gi")
	e.refusedForQuota("a", "four", "80Gi", "SharingPolicy q", "4 whole GPU(s) of at least 80Gi")
	if e.placedOn("a", "one") == "" {
		t.Fatalf("one whole 80Gi GPU under an 80Gi quota not placed: %s", e.claim("a", "one").Annotations[api.AnnotationStatus])
	}
}

// A claim's requests count together: what its earlier requests took is in use when the
// next one is checked, and a claim that exceeds the quota only with all of them is refused.
func TestQuotaCountsEveryRequestOfAClaim(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("80Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
		withWholeGPU(wholeGPUs("a", "two", 1, 0)), builders.MakePod("a", "two").Claim("two").Obj(),
		withWholeGPU(builders.MakeClaim("a", "mixed").Memory("40Gi").Created(1).Obj()), builders.MakePod("a", "mixed").Claim("mixed").Obj(),
		builders.MakeClaim("a", "small").Memory("10Gi").Created(2).Obj(), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	e.checkWithinQuota("a", "80Gi")
	e.refusedForQuota("a", "two", "this claim needs at least 160Gi in all")
	e.refusedForQuota("a", "mixed", "this claim needs at least 120Gi in all")
	if e.placedOn("a", "small") == "" {
		t.Fatalf("small waits behind claims larger than the quota: %s", e.claim("a", "small").Annotations[api.AnnotationStatus])
	}
}

// The allocator places a claim's requests one after another, each with the first
// alternative that fits: a later request that would take the claim beyond the quota on top
// of what the earlier ones took is refused, not queued.
func TestQuotaCountsEarlierRequestsOfAClaim(t *testing.T) {
	c := withWholeGPU(builders.MakeClaim("a", "greedy").Obj())
	c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "two", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 2},
		{Name: "one", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("200Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"), c, builders.MakePod("a", "greedy").Claim("greedy").Obj(),
		builders.MakeClaim("a", "small").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	e.checkWithinQuota("a", "200Gi")
	e.refusedForQuota("a", "greedy", "1 whole GPU(s) of at least 80Gi on top of the 160Gi of its other requests")
	if e.placedOn("a", "small") == "" {
		t.Fatalf("small waits behind a claim beyond the quota: %s", e.claim("a", "small").Annotations[api.AnnotationStatus])
	}
}

// Before a GPU is chosen a whole GPU is known to take at least the smallest GPU's memory;
// the GPUs the claim gets must keep it within quota however large they are.
func TestQuotaWholeGPUsOfMixedSizes(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("100Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), builders.MakeNode("n2").Obj(), builders.MakeSlice("n2", 1, "40Gi"),
		wholeGPUs("a", "two", 2, 0), builders.MakePod("a", "two").Claim("two").Obj())
	e.run()
	e.checkWithinQuota("a", "100Gi")
	e.refusedForQuota("a", "two", "more than the whole quota", "(SharingPolicy q: 100Gi memory)", "2 × a whole GPU")
	// Two small GPUs on one node fit.
	e.create(builders.MakeNode("n3").Obj(), builders.MakeSlice("n3", 2, "40Gi"))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
		gpus := 0
		e.c.model.EachGPU(func(*model.GPU) { gpus++ })
		if _, err := e.c.nodes.Get("n3"); err == nil && gpus == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the allocator did not see node n3 and its GPUs")
		}
	}
	e.run()
	if got := e.placedOn("a", "two"); !strings.HasPrefix(got, "n3/") {
		t.Fatalf("two whole GPUs under a 100Gi quota placed on %q, want two 40Gi GPUs of n3: %s", got, e.claim("a", "two").Annotations[api.AnnotationStatus])
	}
	e.checkWithinQuota("a", "100Gi")
}

// A claim larger than the whole quota is refused at once, does not hold the namespace's
// younger claims, and is placed once the quota grows.
func TestClaimLargerThanQuotaRefusedAtOnce(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("80Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "120Gi"),
		builders.MakeClaim("a", "big").Memory("100Gi").Obj(), builders.MakePod("a", "big").Claim("big").Obj(),
		builders.MakeClaim("a", "small").Memory("10Gi").Created(1).Obj(), builders.MakePod("a", "small").Claim("small").Obj())
	e.run()
	e.refusedForQuota("a", "big", "GPU memory quota of namespace a (SharingPolicy q: 80Gi)", "this claim needs 100Gi")
	if e.placedOn("a", "small") == "" {
		t.Fatalf("small waits behind a claim larger than the quota: %s", e.claim("a", "small").Annotations[api.AnnotationStatus])
	}
	e.setQuotaMemory("q", "200Gi")
	e.run()
	if e.placedOn("a", "big") == "" {
		t.Fatalf("big not placed after the quota grew: %s", e.claim("a", "big").Annotations[api.AnnotationStatus])
	}
}

// An alternative beyond the quota does not make a claim beyond it when another alternative
// only waits for quota: the claim then waits in the quota queue, ahead of younger claims.
func TestQuotaAlternativeBeyondQuotaDoesNotRefuseClaim(t *testing.T) {
	for _, tc := range []struct {
		name, quota, used string
		more              bool // a second request, for 10Gi
	}{
		{name: "the request that waits", quota: "80Gi", used: "10Gi"},
		{name: "a later request that waits", quota: "100Gi", used: "15Gi", more: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := builders.MakeClaim("a", "either").Created(1).Obj()
			c.Spec.Devices.Requests[0] = resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "four", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 4},
				{Name: "one", DeviceClassName: api.DeviceClassExclusive, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}
			if tc.more {
				c.Spec.Devices.Requests = append(c.Spec.Devices.Requests, *builders.MakeClaim("a", "x").Memory("10Gi").Obj().Spec.Devices.Requests[0].DeepCopy())
				c.Spec.Devices.Requests[1].Name = "more"
			}
			e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory(tc.quota).Obj()},
				builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 4, "80Gi"),
				builders.MakeClaim("a", "used").Memory(tc.used).Obj(), builders.MakePod("a", "used").Claim("used").Obj(),
				c, builders.MakePod("a", "either").Claim("either").Obj(),
				builders.MakeClaim("a", "later").Memory("1Gi").Created(2).Obj(), builders.MakePod("a", "later").Claim("later").Obj())
			e.run()
			e.checkWithinQuota("a", tc.quota)
			if st := e.claim("a", "either").Annotations[api.AnnotationStatus]; e.placedOn("a", "either") != "" || !strings.Contains(st, "frees up") {
				t.Fatalf("either: want it waiting for quota, got %q", st)
			}
			if e.placedOn("a", "later") != "" {
				t.Fatal("a younger claim jumped the quota queue")
			}
			if err := e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "used", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			e.run()
			e.checkWithinQuota("a", tc.quota)
			if e.placedOn("a", "either") == "" {
				t.Fatalf("either not placed once quota freed: %s", e.claim("a", "either").Annotations[api.AnnotationStatus])
			}
		})
	}
}

// A claim for whole GPUs that can never fit the quota (2 × 80Gi under 100Gi; the 40Gi GPU is
// alone on its node) must not wait in the quota queue and hold the namespace's younger claims.
func TestWholeGPUsThatNeverFitDoNotHoldTheQueue(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaMemory("100Gi").Obj()},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), builders.MakeNode("n2").Obj(), builders.MakeSlice("n2", 1, "40Gi"),
		builders.MakeClaim("a", "used").Memory("30Gi").Obj(), builders.MakePod("a", "used").Claim("used").Obj(),
		wholeGPUs("a", "two", 2, 1), builders.MakePod("a", "two").Claim("two").Obj(),
		builders.MakeClaim("a", "later").Memory("1Gi").Created(2).Obj(), builders.MakePod("a", "later").Claim("later").Obj())
	e.run()
	if e.placedOn("a", "two") != "" {
		t.Fatal("2 whole GPUs placed over a 100Gi quota")
	}
	if e.placedOn("a", "later") == "" {
		t.Errorf("a 1Gi claim held behind a claim that can never fit the quota: %s", e.claim("a", "later").Annotations[api.AnnotationStatus])
	}
}

// Under a compute quota, a share that would get no compute (charged 0%, its kernels
// uncapped) is refused with what to do; with compute asked, or a policy that derives it,
// shares are placed and charged.
func TestComputeQuotaRefusesUncappedShares(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  *api.SharingPolicy
		compute string // "" asks none
		placed  bool
	}{
		{"no compute asked", builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaCompute(50).Obj(), "", false},
		{"compute 0 asked", builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaCompute(50).Obj(), "0", false},
		{"compute asked", builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaCompute(50).Obj(), "10", true},
		{"policy default", builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaCompute(50).DefaultCompute(10).Obj(), "", true},
		{"from memory", builders.MakePolicy("q").Isolation(api.IsolationNone).QuotaCompute(50).ComputeFromMemory().Obj(), "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := builders.MakeClaim("a", "c").Memory("10Gi")
			if tc.compute != "" {
				claim = claim.Compute(tc.compute)
			}
			e := newEnv(t, []*api.SharingPolicy{tc.policy}, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
				claim.Obj(), builders.MakePod("a", "c").Claim("c").Obj())
			e.run()
			placed := e.placedOn("a", "c") != ""
			if placed != tc.placed {
				t.Fatalf("placed %v, want %v: %s", placed, tc.placed, e.claim("a", "c").Annotations[api.AnnotationStatus])
			}
			if placed {
				charged := e.charged("a").Comp
				if charged == 0 {
					t.Error("a placed share was charged no compute")
				}
				return
			}
			if ev := e.events(ReasonUnsupported); len(ev) == 0 || !strings.Contains(ev[0], "compute quota") || !strings.Contains(ev[0], "defaultCompute") {
				t.Errorf("events %v: want FgpuUnsupported naming the compute quota and what to do", ev)
			}
		})
	}
}

// A tenant labels its pods into a higher-priority policy that sets no quota: it gets that
// policy's co-tenancy rules, but its namespace's quota still binds its claims, and the
// messages name the policy whose quota binds.
func TestPodLabelsCannotLiftNamespaceQuota(t *testing.T) {
	e := newEnv(t, []*api.SharingPolicy{
		builders.MakePolicy("quota").Isolation(api.IsolationNone).QuotaMemory("40Gi").Obj(),
		builders.MakePolicy("escape").Priority(100).Isolation(api.IsolationNone).Namespaces("kubernetes.io/metadata.name", "a").Pods("fgpu.dev/escape", "yes").Obj(),
	},
		builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"), namespaceObj("a"),
		builders.MakeClaim("a", "big").Memory("60Gi").Obj(), builders.MakePod("a", "big").Claim("big").Label("fgpu.dev/escape", "yes").Obj(),
		builders.MakeClaim("a", "first").Memory("30Gi").Created(1).Obj(), builders.MakePod("a", "first").Claim("first").Label("fgpu.dev/escape", "yes").Obj(),
		builders.MakeClaim("a", "second").Memory("30Gi").Created(2).Obj(), builders.MakePod("a", "second").Claim("second").Label("fgpu.dev/escape", "yes").Obj())
	e.run()
	e.checkWithinQuota("a", "40Gi")
	// refusedForQuota would find second in the quota queue, rightly: check big by hand.
	big := "larger than the GPU memory quota of namespace a (SharingPolicy quota: 40Gi): this claim needs 60Gi; it will not be placed unless the quota is raised"
	if e.placedOn("a", "big") != "" || !strings.Contains(e.claim("a", "big").Annotations[api.AnnotationStatus], big) {
		t.Errorf("big: placed on %q, status %q; want it refused: %q", e.placedOn("a", "big"), e.claim("a", "big").Annotations[api.AnnotationStatus], big)
	}
	if got := e.placedOn("a", "first"); got == "" {
		t.Fatalf("first not placed: %s", e.claim("a", "first").Annotations[api.AnnotationStatus])
	}
	if st := e.claim("a", "first").Annotations[api.AnnotationStatus]; !strings.Contains(st, "[SharingPolicy escape]") {
		t.Errorf("first placed under %q, want the pod-selected policy's co-tenancy rules", st)
	}
	if e.placedOn("a", "second") != "" {
		t.Fatal("second placed over the namespace's quota through a pod-selected policy")
	}
	want := "over the GPU memory quota of namespace a (SharingPolicy quota: 40Gi): 30Gi in use, this claim needs 30Gi, 20Gi over; it will be placed when quota frees up"
	if st := e.claim("a", "second").Annotations[api.AnnotationStatus]; !strings.Contains(st, want) {
		t.Errorf("status of second %q, want %q", st, want)
	}
}
