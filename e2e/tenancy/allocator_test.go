package tenancy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// Findings 1 and 2, allocator mode: under a policy with isolation none, which a tenant can
// reach by labelling its pods, claims of two namespaces share GPUs; a claim naming the
// victim's domain, "ns-<victim>" or "default" still gets its own namespace's MPS server.
func TestAllocatorModeClaimNamingAnotherDomainStaysHome(t *testing.T) {
	useMode(t, allocatorMode)
	key := "fgpu.dev/e2e-tenancy-domains"
	nss := namespaces(t, "dom", key, 2)
	createPolicy(t, builders.MakePolicy("e2e-tenancy-none").Priority(10).Isolation(api.IsolationNone).Namespaces(key, nss[0]).Obj())
	attackDomains(t, nss[0], cluster.Tenant(t, nss[1], "attacker"))
}

// Finding 3: two 63-character namespaces whose names agree in their first 59 characters and
// whose FNV-32a hashes collide (the old "ns-" + 51 characters + 32-bit hash domain gave both
// the same domain) get different domains, pipe directories and, without allowSharedGPU,
// different GPUs.
func TestLongNamespacesGetTheirOwnDomains(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	names := []string{
		"tenancy-sixty-three-characters-long-namespace-names-0000000jvlo",
		"tenancy-sixty-three-characters-long-namespace-names-00000002pda",
	}
	type got struct{ gpu, domain, pipe string }
	var g []got
	for _, ns := range names {
		cluster.NamedNamespace(t, ns)
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "p").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range names {
		pod := running(t, ns, "p")
		gpu, _ := gpuOf(t, pod)
		r := probe(t, ns, "p")
		g = append(g, got{gpu, r.Env["FGPU_ISOLATION_DOMAIN"], r.Env["CUDA_MPS_PIPE_DIRECTORY"]})
		// Alone on its GPU under a policy that keeps other domains off it: the cap binds.
		if r.Env["FGPU_MEMORY_ENFORCED"] != "true" {
			t.Errorf("%s/p has a GPU no other domain may share, but FGPU_MEMORY_ENFORCED=%q (%s)", ns, r.Env["FGPU_MEMORY_ENFORCED"], r.Env["FGPU_MEMORY_ENFORCEMENT"])
		}
	}
	if g[0].domain == g[1].domain || g[0].pipe == g[1].pipe {
		t.Errorf("two namespaces share an MPS server: %+v", g)
	}
	if g[0].gpu == g[1].gpu {
		t.Errorf("two namespaces share %s without allowSharedGPU: %+v", g[0].gpu, g)
	}
	healthy(t, names...)
}

// Finding 4: the tenant rewrites the co-tenancy record on its own placed claim
// ({"maxTenants":1}); after an allocator restart the GPU still takes another namespace's
// claim (the rules come from what only the allocator writes). Removing the allocator's
// finalizer from the allocated claim is refused (fgpu-claims-keep-finalizers), so the claim
// cannot vanish while its pod runs, and the finalizer is still there after the restart.
func TestTamperedClaimMetadataSurvivesRestart(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-tamper"
	nss := namespaces(t, "tamper", key, 2)
	attackerNS, victimNS := nss[0], nss[1]
	createPolicy(t, builders.MakePolicy("e2e-tenancy-shared").Priority(10).Namespaces(key, attackerNS).AllowShared().Obj())
	tenant := cluster.Tenant(t, attackerNS, "attacker")

	if _, err := framework.MakeGPUPod(attackerNS, "a").Memory("10Gi").CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	pod := running(t, attackerNS, "a")
	gpu, _ := gpuOf(t, pod)
	// The other GPU is taken whole, so the victim can only go to the attacker's.
	filler := cluster.Namespace(t, "filler")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(filler, "whole").Class(api.DeviceClassExclusive)); err != nil {
		t.Fatal(err)
	}
	fillerGPU, _ := gpuOf(t, running(t, filler, "whole"))
	if fillerGPU == gpu {
		t.Fatalf("the whole-GPU filler landed on the attacker's %s", gpu)
	}

	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := tenant.Client.ResourceV1().ResourceClaims(attackerNS).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if c.Annotations == nil {
			c.Annotations = map[string]string{}
		}
		c.Annotations["fgpu.dev/tenancy"] = `{"maxTenants":1}` // what earlier allocators read back
		stripped := c.DeepCopy()
		stripped.Finalizers = nil
		_, err = tenant.Client.ResourceV1().ResourceClaims(attackerNS).Update(ctx, stripped, metav1.UpdateOptions{})
		switch {
		case err == nil:
			return false, fmt.Errorf("the tenant removed the finalizers %v of its allocated claim", c.Finalizers)
		case apierrors.IsConflict(err):
			return false, nil
		case !strings.Contains(err.Error(), "holds an allocation of fgpu GPU shares, so its finalizers may not be removed"):
			return false, fmt.Errorf("removing the finalizers was refused, but not by fgpu-claims-keep-finalizers: %w", err)
		}
		_, err = tenant.Client.ResourceV1().ResourceClaims(attackerNS).Update(ctx, c, metav1.UpdateOptions{})
		return err == nil, nil
	})
	if err != nil {
		t.Fatalf("the tenant could not tamper with its own claim's metadata: %v", err)
	}
	restartAllocator(t)

	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "v").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if vgpu, _ := gpuOf(t, running(t, victimNS, "v")); vgpu != gpu {
		t.Errorf("the victim got %s, want the attacker's %s (the filler holds %s)", vgpu, gpu, fillerGPU)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(attackerNS).Get(ctx, claim.Name, metav1.GetOptions{})
		return err == nil && hasFinalizer(c, api.FinalizerAllocator), nil
	})
	if err != nil {
		t.Errorf("the allocator's finalizer %s is not on %s/%s after the restart", api.FinalizerAllocator, attackerNS, claim.Name)
	}
	healthy(t, attackerNS, victimNS, filler)
}

func hasFinalizer(c *resourceapi.ResourceClaim, f string) bool {
	for _, x := range c.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

// quotaNamespace is a tenant's namespace with a SharingPolicy that gives it a memory quota.
func quotaNamespace(t *testing.T, prefix, policy, quota string) (*framework.Tenant, string) {
	t.Helper()
	key := "fgpu.dev/e2e-tenancy-" + prefix
	ns := namespaces(t, prefix, key, 1)[0]
	createPolicy(t, builders.MakePolicy(policy).Priority(10).Namespaces(key, ns).QuotaMemory(quota).Obj())
	return cluster.Tenant(t, ns, "attacker"), ns
}

// Finding 5: four whole 80Gi GPUs against an 80Gi quota are refused at once, saying why;
// nothing is allocated.
func TestWholeGPUsCountAgainstQuota(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	tenant, ns := quotaNamespace(t, "whole", "e2e-tenancy-whole-quota", "80Gi")
	pod, err := framework.MakeGPUPod(ns, "four").Class(api.DeviceClassExclusive).Count(4).CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, pod, 20*time.Second, "quota", "e2e-tenancy-whole-quota")
	if _, err := cluster.WaitEvent(ctx, ns, "four", "quota", 10*time.Second); err != nil {
		t.Error(err)
	}
	time.Sleep(2 * time.Second)
	notAllocated(t, pod)
	healthy(t, ns)
}

// Finding 5: a claim larger than the whole quota is refused at once and holds no one: the
// small claim created after it runs.
func TestClaimLargerThanQuotaHoldsNoOne(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	tenant, ns := quotaNamespace(t, "bigq", "e2e-tenancy-big-quota", "20Gi")
	big, err := framework.MakeGPUPod(ns, "big").Memory("40Gi").CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	msg := waitClaimStatus(t, big, 20*time.Second, "larger than", "e2e-tenancy-big-quota")
	if strings.Contains(msg, "when quota frees up") {
		t.Errorf("a claim that can never fit is told it will be placed later: %s", msg)
	}
	if _, err := framework.MakeGPUPod(ns, "small").Memory("10Gi").CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	running(t, ns, "small")
	notAllocated(t, big)
	healthy(t, ns)
}

// Finding 5: pods labelled into a higher-priority policy without a quota still count
// against their namespace's quota; the claim beyond it waits, naming the quota's policy.
func TestPodLabelsCannotEscapeNamespaceQuota(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	tenant, ns := quotaNamespace(t, "escape", "e2e-tenancy-ns-quota", "20Gi")
	createPolicy(t, builders.MakePolicy("e2e-tenancy-no-quota").Priority(100).
		Namespaces("fgpu.dev/e2e-tenancy-escape", ns).Pods("escape", "yes").Obj())
	for _, name := range []string{"p1", "p2"} {
		if _, err := framework.MakeGPUPod(ns, name).Memory("10Gi").Label("escape", "yes").CreateAs(ctx, tenant.Client); err != nil {
			t.Fatal(err)
		}
		running(t, ns, name)
	}
	p3, err := framework.MakeGPUPod(ns, "p3").Memory("10Gi").Label("escape", "yes").CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, p3, 20*time.Second, "quota", "e2e-tenancy-ns-quota")
	notAllocated(t, p3)
	healthy(t, ns)
}

// Finding 6: a tenant's timeSlicing claim does not turn another namespace's claim, which
// names no mode, into time-slicing: the victim gets MPS with its memory cap enforced.
func TestTimeSlicingNeighbourKeepsVictimEnforced(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-auto"
	nss := namespaces(t, "auto", key, 2)
	attackerNS, victimNS := nss[0], nss[1]
	createPolicy(t, builders.MakePolicy("e2e-tenancy-auto").Priority(10).Isolation(api.IsolationNone).Namespaces(key, attackerNS).Obj())
	tenant := cluster.Tenant(t, attackerNS, "attacker")
	if _, err := framework.MakeGPUPod(attackerNS, "ts").Memory("10Gi").Config(map[string]any{"mode": "timeSlicing"}).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	tsGPU, _ := gpuOf(t, running(t, attackerNS, "ts"))
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "v").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	vGPU, _ := gpuOf(t, running(t, victimNS, "v"))
	r := probe(t, victimNS, "v")
	// Both namespaces may share a GPU (isolation none), so the victim's cap is per MPS
	// process (FGPU_MEMORY_ENFORCED=false, saying so), but it is never time-sliced: it
	// goes to the other GPU.
	if r.Env["FGPU_SHARING_MODE"] != "mps" || strings.Contains(r.Env["FGPU_MEMORY_ENFORCEMENT"], "time-slicing") {
		t.Errorf("the victim lost its memory cap to a neighbour's time-slicing: FGPU_SHARING_MODE=%s FGPU_MEMORY_ENFORCEMENT=%q",
			r.Env["FGPU_SHARING_MODE"], r.Env["FGPU_MEMORY_ENFORCEMENT"])
	}
	if vGPU == tsGPU {
		t.Errorf("the victim's MPS claim shares the time-sliced %s", tsGPU)
	}
	healthy(t, attackerNS, victimNS)
}

// Finding 6: where a policy lets two namespaces share a GPU (allowSharedGPU), caps cannot be
// enforced against a process that bypasses MPS: both pods are told so.
func TestSharedGPUSaysCapsAreNotEnforced(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-sharedgpu"
	nss := namespaces(t, "shared", key, 2)
	createPolicy(t, builders.MakePolicy("e2e-tenancy-sharedgpu").Priority(10).Namespaces(key, nss[0]).AllowShared().Obj())
	filler := cluster.Namespace(t, "filler")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(filler, "whole").Class(api.DeviceClassExclusive)); err != nil {
		t.Fatal(err)
	}
	fillerGPU, _ := gpuOf(t, running(t, filler, "whole"))
	gpus := map[string]bool{}
	for _, ns := range nss {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "p").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
	}
	for _, ns := range nss {
		gpu, _ := gpuOf(t, running(t, ns, "p"))
		gpus[gpu] = true
		r := probe(t, ns, "p")
		if r.Env["FGPU_MEMORY_ENFORCED"] != "false" || r.Env["FGPU_MEMORY_ENFORCEMENT"] == "" {
			t.Errorf("%s/p shares %s with another namespace but is told FGPU_MEMORY_ENFORCED=%q FGPU_MEMORY_ENFORCEMENT=%q",
				ns, gpu, r.Env["FGPU_MEMORY_ENFORCED"], r.Env["FGPU_MEMORY_ENFORCEMENT"])
		}
	}
	if len(gpus) != 1 || gpus[fillerGPU] {
		t.Fatalf("the two namespaces did not share the free GPU: %v (filler on %s)", gpus, fillerGPU)
	}
	healthy(t, append(nss, filler)...)
}

// Finding 7: a second allocation on a GPU that cannot hold it, written the way a deposed
// allocator leader would (the test's admin writes the claim's status), is refused by the
// plugin at prepare; the pod must not stay in ContainerCreating: the allocator places the
// claim again and both pods run.
func TestForcedOverCommitEndsRunning(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	ns := cluster.Namespace(t, "overcommit")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "first").Memory("60Gi")); err != nil {
		t.Fatal(err)
	}
	_, first := gpuOf(t, running(t, ns, "first"))

	tmpl := framework.MakeGPUPod(ns, "second").Memory("40Gi").Template()
	forged := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "second"}, Spec: tmpl.Spec.Spec}
	forged, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, forged, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// What the allocator writes first (annotation and finalizers), then the allocation: the
	// first claim's, on the same GPU, with a share of its own.
	forged.Annotations = map[string]string{}
	for k, v := range first.Annotations {
		if strings.HasPrefix(k, "fgpu.dev/") && k != api.AnnotationStatus {
			forged.Annotations[k] = v
		}
	}
	forged.Finalizers = first.Finalizers
	if forged, err = cluster.Client.ResourceV1().ResourceClaims(ns).Update(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	alloc := first.Status.Allocation.DeepCopy()
	r := &alloc.Devices.Results[0]
	r.ShareID = ptr.To(uuid.NewUUID())
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse("40Gi")}
	forged.Status.Allocation = alloc
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, forged, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := framework.MakeGPUPod(ns, "second").Pod()
	pod.Spec.ResourceClaims[0].ResourceClaimTemplateName = nil
	pod.Spec.ResourceClaims[0].ResourceClaimName = ptr.To("second")
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The kubelet prepares a pod's claims again only at its next sync of the pod, about a
	// minute after the refusal here (75–98 s in passing runs), more on a loaded machine.
	if _, err := cluster.WaitRunning(ctx, ns, "second", 3*time.Minute); err != nil {
		t.Fatalf("%v\n%s", err, eventsOf(ns, "second"))
	}
	running(t, ns, "first")
	healthy(t, ns)
}

// Finding 8: a SharingPolicy with a malformed selector never silently selects nothing: the
// schema refuses it at create or, if it is stored, the allocator reports it on the policy
// (condition Accepted=False with the error).
func TestInvalidPolicyIsRefusedOrReported(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	bad := map[string]metav1.LabelSelectorRequirement{
		"e2e-tenancy-bad-operator": {Key: "team", Operator: "Bogus", Values: []string{"a"}},
		"e2e-tenancy-in-no-values": {Key: "team", Operator: metav1.LabelSelectorOpIn},
		"e2e-tenancy-bad-key":      {Key: "not a key!", Operator: metav1.LabelSelectorOpExists},
	}
	for name, req := range bad {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := builders.MakePolicy(name).QuotaMemory("10Gi").Obj()
			p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{req}}
			p.Labels = map[string]string{policyLabel: "true"}
			_, err := fgpuClient.FgpuV1alpha1().SharingPolicies().Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				if !apierrors.IsInvalid(err) {
					t.Errorf("refused, but not as invalid: %v", err)
				}
				return
			}
			t.Cleanup(func() {
				_ = fgpuClient.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
			if msg, ok := waitPolicyNotAccepted(ctx, name, 20*time.Second); !ok {
				t.Errorf("selector %+v was stored and carries no Accepted=False condition", req)
			} else if msg == "" {
				t.Error("Accepted=False without a message")
			}
		})
	}
}

// waitPolicyNotAccepted waits for a policy's status condition Accepted=False and returns
// its message.
func waitPolicyNotAccepted(ctx context.Context, name string, timeout time.Duration) (string, bool) {
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		u, err := dynClient.Resource(api.SchemeGroupVersion.WithResource("sharingpolicies")).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Accepted" && m["status"] == "False" {
				msg, _ = m["message"].(string)
				return true, nil
			}
		}
		return false, nil
	})
	return msg, err == nil
}
