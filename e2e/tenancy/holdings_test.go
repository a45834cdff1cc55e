package tenancy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// Issue #24, finding 3 (round 3): what a namespace holds, not only what it asks, is charged,
// and privileges come from an administrator, not from the labels a tenant writes.

// placementOf is the allocator's record of how the pod's claim was placed.
func placementOf(t *testing.T, pod *corev1.Pod) *api.Placement {
	t.Helper()
	_, claim := gpuOf(t, pod)
	a := claim.Status.Allocation
	cfg, err := api.MergeConfigs(framework.Driver, a.Devices.Config, a.Devices.Results[0].Request)
	if err != nil || cfg.Placement == nil {
		t.Fatalf("claim %s/%s has no placement record: %v", claim.Namespace, claim.Name, err)
	}
	return cfg.Placement
}

// Time-sliced claims used to keep every other namespace's MPS claims off the GPUs they were
// on, for 1Gi of quota each. Both namespaces may share GPUs (isolation none) and have 10Gi of
// quota. The tenant's time-sliced claim of two GPUs would keep two GPUs' room: it is refused
// at once. A second 1Gi time-sliced claim goes next to the first, not onto the other GPU
// (that GPU's room would count against the quota), and the other namespace's MPS claim gets
// the other GPU.
func TestTimeSlicedClaimsDoNotKeepOtherNamespacesOff(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-sliced"
	nss := namespaces(t, "sliced", key, 2)
	attackerNS, victimNS := nss[0], nss[1]
	createPolicy(t, builders.MakePolicy("e2e-tenancy-sliced").Priority(10).Isolation(api.IsolationNone).Namespaces(key, attackerNS).QuotaMemory("10Gi").Obj())
	tenant := cluster.Tenant(t, attackerNS, "attacker")
	ts := map[string]any{"mode": "timeSlicing"}
	if _, err := framework.MakeGPUPod(attackerNS, "ts1").Memory("1Gi").Config(ts).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	sliced, _ := gpuOf(t, running(t, attackerNS, "ts1"))
	pair, err := framework.MakeGPUPod(attackerNS, "pair").Memory("512Mi").Count(2).Config(ts).CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, pair, 30*time.Second, "larger than the GPU quota", "free from other namespaces", "unless the quota is raised")
	notAllocated(t, pair)
	if _, err := framework.MakeGPUPod(attackerNS, "ts2").Memory("1Gi").Config(ts).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	if got, _ := gpuOf(t, running(t, attackerNS, "ts2")); got != sliced {
		t.Errorf("the second time-sliced claim turned %s to time-slicing too (the first is on %s)", got, sliced)
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "v").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if got, _ := gpuOf(t, running(t, victimNS, "v")); got == sliced {
		t.Errorf("the victim's MPS claim is on the time-sliced %s", got)
	}
	healthy(t, attackerNS, victimNS)
}

// The admin gives the critical class to its serving team's namespace (namespaceSelector and
// pod label); a podSelector-only critical policy is refused by the schema or, stored, applies
// to no pod. The tenant labels its pod critical in its own namespace: it runs, but with its
// namespace's rules, not the critical class; the team's labelled pod gets it.
func TestPodLabelDoesNotGrantTheCriticalClass(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-critical"
	team := namespaces(t, "serving", key, 1)[0]
	tenantNS := cluster.Namespace(t, "labeller")
	critical := func(name string) *builders.PolicyBuilder {
		return builders.MakePolicy(name).Priority(100).Latency(api.LatencyCritical).MaxCo(0).Pods("fgpu.dev/latency", "critical")
	}
	createPolicy(t, critical("e2e-tenancy-critical").Namespaces(key, team).Obj())
	labelsOnly := critical("e2e-tenancy-critical-by-label").Obj()
	labelsOnly.Labels = map[string]string{policyLabel: "true"}
	switch _, err := fgpuClient.FgpuV1alpha1().SharingPolicies().Create(ctx, labelsOnly, metav1.CreateOptions{}); {
	case apierrors.IsInvalid(err):
	case err != nil:
		t.Fatalf("refused, but not as invalid: %v", err)
	default:
		t.Cleanup(func() {
			_ = fgpuClient.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), labelsOnly.Name, metav1.DeleteOptions{})
		})
		if msg, ok := waitPolicyNotAccepted(ctx, labelsOnly.Name, 20*time.Second); !ok {
			t.Error("a critical policy that pod labels alone select is accepted")
		} else if msg == "" {
			t.Error("Accepted=False without a message")
		}
	}
	tenant := cluster.Tenant(t, tenantNS, "attacker")
	if _, err := framework.MakeGPUPod(tenantNS, "p").Memory("1Gi").Label("fgpu.dev/latency", "critical").CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	// Its namespace's rules: the chart's default policy, or the built-in default.
	if pl := placementOf(t, running(t, tenantNS, "p")); pl.LatencyClass == api.LatencyCritical || strings.HasPrefix(pl.Policy, "e2e-tenancy-critical") {
		t.Errorf("the tenant's labelled pod got %+v; want its namespace's rules, not a critical policy", pl)
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(team, "p").Memory("1Gi").Label("fgpu.dev/latency", "critical")); err != nil {
		t.Fatal(err)
	}
	if pl := placementOf(t, running(t, team, "p")); pl.LatencyClass != api.LatencyCritical || pl.Policy != "e2e-tenancy-critical" {
		t.Errorf("the serving team's labelled pod got %+v; want the critical class of e2e-tenancy-critical", pl)
	}
	healthy(t, team, tenantNS)
}

// Four 256Mi claims in four isolation sub-domains used to hold four whole GPUs under a 2Gi
// quota. A sub-domain keeps every other domain off its GPU, so a second one would keep a
// whole GPU's room: it waits, saying so, while claims of the first domain join its GPU; once
// those are gone it runs.
func TestSubDomainClaimsPayForTheGPUsTheyHold(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	tenant, ns := quotaNamespace(t, "subdomains", "e2e-tenancy-subdomains", "2Gi")
	domain := func(d string) map[string]any { return map[string]any{"isolationDomain": d} }
	if _, err := framework.MakeGPUPod(ns, "d0").Memory("256Mi").Config(domain("d0")).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	first, _ := gpuOf(t, running(t, ns, "d0"))
	d1, err := framework.MakeGPUPod(ns, "d1").Memory("256Mi").Config(domain("d1")).CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	waitClaimStatus(t, d1, 30*time.Second, "over quota with the free room", "over its 2Gi quota")
	notAllocated(t, d1)
	if _, err := framework.MakeGPUPod(ns, "d0b").Memory("256Mi").Config(domain("d0")).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	if got, _ := gpuOf(t, running(t, ns, "d0b")); got != first {
		t.Errorf("a claim of domain d0 went to %s, not to d0's GPU %s", got, first)
	}
	for _, name := range []string{"d0", "d0b"} {
		if err := tenant.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	running(t, ns, "d1")
	healthy(t, ns)
}

// Issue #24, M4: an admin grants allowSharedGPU to a namespace, with a 4Gi quota; its
// edit-only tenant pins a 1Gi share to each GPU (selectors on the GPU's index), one of them a
// standalone claim that a Deployment's pod uses, under a PodDisruptionBudget. That used to
// keep every claim that does not share across namespaces off the node, uncharged. Alone on
// two GPUs, the namespace holds one GPU's room its quota does not pay for: another
// namespace's 10Gi pod (the default isolation) asking for that GPU runs, the Deployment's pod
// is preempted (FgpuPreempted; the budget does not stop it), its replacement cannot reserve
// the claim there, and once the claim is deallocated it is placed again under the usual rules
// (pinned to the GPU taken back, it waits). The tenant's pod on the GPU it keeps runs on.
func TestSpreadSharesGiveBackWhatTheirQuotaDoesNotPay(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	key := "fgpu.dev/e2e-tenancy-spread"
	spreadNS := namespaces(t, "spread", key, 1)[0]
	teamNS := cluster.Namespace(t, "spread-victim")
	createPolicy(t, builders.MakePolicy("e2e-tenancy-spread").Priority(10).AllowShared().Namespaces(key, spreadNS).QuotaMemory("4Gi").Obj())
	tenant := cluster.Tenant(t, spreadNS, "attacker")
	pin := func(index int) string { return fmt.Sprintf(`device.attributes["gpu.fgpu.dev"].index == %d`, index) }
	if _, err := framework.MakeGPUPod(spreadNS, "pin0").Memory("1Gi").Selector(pin(0)).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	running(t, spreadNS, "pin0")

	web := framework.MakeGPUPod(spreadNS, "web").Memory("1Gi").Selector(pin(1))
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: spreadNS, Name: "web"}, Spec: web.Template().Spec.Spec}
	if _, err := tenant.Client.ResourceV1().ResourceClaims(spreadNS).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := web.Pod().Spec
	spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("web")}}
	// It takes its time to end, as a server draining its requests does: its replacement is
	// scheduled meanwhile, and would reserve the claim where it is.
	spec.TerminationGracePeriodSeconds = ptr.To[int64](20)
	spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 15}}}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: spreadNS, Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: spec}}}
	if _, err := tenant.Client.AppsV1().Deployments(spreadNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: spreadNS, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	if _, err := tenant.Client.PolicyV1().PodDisruptionBudgets(spreadNS).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	webPods := func() []corev1.Pod {
		pods, err := cluster.Client.CoreV1().Pods(spreadNS).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		return pods.Items
	}
	var first corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, podTimeout, true, func(context.Context) (bool, error) {
		pods := webPods()
		if len(pods) != 1 || pods[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		first = pods[0]
		return true, nil
	}); err != nil {
		t.Fatalf("the Deployment's pod does not run: %v", err)
	}
	if c, err := cluster.Client.ResourceV1().ResourceClaims(spreadNS).Get(ctx, "web", metav1.GetOptions{}); err != nil || c.Status.Allocation == nil ||
		c.Status.Allocation.Devices.Results[0].Device != "gpu-1" {
		t.Fatalf("the Deployment's claim is not on gpu-1: %v %+v", err, c)
	}

	if _, err := cluster.Create(ctx, framework.MakeGPUPod(teamNS, "v").Memory("10Gi").Selector(pin(1))); err != nil {
		t.Fatal(err)
	}
	if gpu, _ := gpuOf(t, running(t, teamNS, "v")); gpu != "gpu-1" {
		t.Fatalf("the other namespace's pod runs on %s, want gpu-1", gpu)
	}
	if ev := eventsOf(spreadNS, first.Name); !strings.Contains(ev, "FgpuPreempted") || !strings.Contains(ev, "more than its GPU quota pays for") || strings.Contains(ev, teamNS) {
		t.Errorf("the preempted pod's events do not say why (or name the waiting namespace):\n%s", ev)
	}
	// The replacement waits: the claim was placed again, pinned to the GPU taken back.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(spreadNS).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, marked := c.Annotations[api.AnnotationReclaimed]
		return !marked && c.Status.Allocation == nil && strings.Contains(c.Annotations[api.AnnotationStatus], "no GPU can take 1Gi now"), nil
	}); err != nil {
		c, _ := cluster.Client.ResourceV1().ResourceClaims(spreadNS).Get(ctx, "web", metav1.GetOptions{})
		t.Fatalf("the Deployment's claim was not placed again (waiting): %v\n%+v", err, c)
	}
	for _, p := range webPods() {
		if p.UID != first.UID && p.Spec.NodeName != "" {
			t.Errorf("the Deployment's new pod %s was bound to %s", p.Name, p.Spec.NodeName)
		}
	}
	running(t, spreadNS, "pin0")
	healthy(t, spreadNS, teamNS)
}
