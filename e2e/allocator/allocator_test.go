package allocator

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// The allocator, not kube-scheduler, places three shares (the suite leaves allocationMode to
// the chart's default); the pods run and say where.
func TestAllocatorPlacesShares(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "alloc")
	sizes := map[string]string{"small": "10Gi", "medium": "20Gi", "large": "30Gi"}
	for name, mem := range sizes {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, name).Memory(mem)); err != nil {
			t.Fatal(err)
		}
	}
	for name, mem := range sizes {
		pod, err := cluster.WaitRunning(ctx, ns, name, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		_, claim := gpuOf(t, pod)
		r := claim.Status.Allocation.Devices.Results[0]
		if got := r.ConsumedCapacity[api.CapacityMemory]; got.String() != mem {
			t.Errorf("%s: consumed %s, want %s", name, got.String(), mem)
		}
		if len(r.Tolerations) == 0 || r.Tolerations[0].Key != api.FenceTaintKey {
			t.Errorf("%s: no fence toleration in %+v", name, r)
		}
		if _, err := cluster.WaitEvent(ctx, ns, name, "placed on "+cluster.Node+"/gpu-", 30*time.Second); err != nil {
			t.Error(err)
		}
	}
	checkInvariant(t)
}

// Claims of different namespaces never share a GPU by default: with two GPUs, a third
// namespace waits, is told why, and runs once a GPU frees up.
func TestNamespaceIsolation(t *testing.T) {
	ctx := context.Background()
	var nss []string
	for i := 0; i < 3; i++ {
		nss = append(nss, cluster.Namespace(t, "iso"))
	}
	gpus := map[string]string{}
	for _, ns := range nss[:2] {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "p").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
		pod, err := cluster.WaitRunning(ctx, ns, "p", 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		gpus[ns], _ = gpuOf(t, pod)
	}
	if gpus[nss[0]] == gpus[nss[1]] {
		t.Fatalf("namespaces %s and %s share %s", nss[0], nss[1], gpus[nss[0]])
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(nss[2], "p").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, nss[2], "p", "isolation", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	waitPending(t, nss[2], "p", 2*time.Second)
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(nss[0]).Delete(ctx, "p", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, nss[2], "p", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t)
}

// A critical claim takes the least-loaded GPU and, with maxCoTenants 0, keeps it alone.
func TestLatencyCritical(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "lat")
	cluster.LabelNamespace(t, ns, "fgpu.dev/e2e-latency", ns)
	createPolicy(t, builders.MakePolicy("e2e-critical").Namespaces("fgpu.dev/e2e-latency", ns).Priority(10).Pods("tier", "critical").
		Isolation(api.IsolationNone).Latency(api.LatencyCritical).MaxCo(0).Obj())
	createPolicy(t, builders.MakePolicy("e2e-packed").Namespaces("fgpu.dev/e2e-latency", ns).Priority(5).
		Isolation(api.IsolationNone).Latency(api.LatencyBestEffort).Obj())

	run := func(name string, critical bool) string {
		p := framework.MakeGPUPod(ns, name).Memory("10Gi")
		if critical {
			p = p.Label("tier", "critical")
		}
		if _, err := cluster.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		pod, err := cluster.WaitRunning(ctx, ns, name, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		gpu, _ := gpuOf(t, pod)
		return gpu
	}
	be1 := run("be1", false)
	crit := run("crit", true)
	be2 := run("be2", false)
	if crit == be1 || crit == be2 {
		t.Fatalf("critical claim on %s shares with best-effort ones (%s, %s)", crit, be1, be2)
	}
	checkInvariant(t)
}

// A namespace over its memory quota waits in order, is told which quota and by how much,
// and runs as soon as quota frees up.
func TestQuota(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "quota")
	cluster.LabelNamespace(t, ns, "fgpu.dev/e2e-quota", ns)
	createPolicy(t, builders.MakePolicy("e2e-quota").Priority(10).Isolation(api.IsolationNone).
		Namespaces("fgpu.dev/e2e-quota", ns).QuotaMemory("20Gi").Obj())
	for _, name := range []string{"p1", "p2"} {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, name).Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.WaitRunning(ctx, ns, name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "p3").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	ev, err := cluster.WaitEvent(ctx, ns, "p3", "quota", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ev, "20Gi") || !strings.Contains(ev, "10Gi over") || !strings.Contains(ev, "e2e-quota") {
		t.Errorf("quota event does not say which quota and by how much: %s", ev)
	}
	waitPending(t, ns, "p3", 2*time.Second)
	checkKubectlFgpuOverQuota(t, ns)
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "p1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "p3", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	checkInvariant(t)
}

// A pod that fits no node is not pinned anywhere, and its events say why.
func TestPodThatFitsNowhereSaysWhy(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "nofit")
	p := framework.MakeGPUPod(ns, "p").Memory("10Gi")
	pod := p.Pod()
	pod.Spec.NodeSelector = map[string]string{"fgpu.dev/e2e-nowhere": "true"}
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, p.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "p", "didn't match the pod's node affinity/selector", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Fatal("the claim of a pod that fits nowhere was allocated")
	}
}

// kube-scheduler leaves an allocation in place forever when the pod then fails a node
// check the allocator does not make (here ephemeral storage): the allocator takes it back
// after the bind timeout, says so, and does not put it on that node again for that pod.
func TestAllocationTimesOut(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "timeout")
	p := framework.MakeGPUPod(ns, "p").Memory("10Gi")
	pod := p.Pod()
	pod.Spec.Containers[0].Resources.Requests = corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("100Pi")}
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, p.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "p", "placed on", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "p", "was not scheduled to node "+cluster.Node, time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "p", "timed out: the pod did not bind there", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Fatalf("allocation to %s kept after the timeout", cluster.Node)
	}
	checkInvariant(t)
}

// The admission policy refuses claims and templates that tolerate the fence, keyless
// tolerations included, with a message that names the taint.
func TestAdmissionRefusesFenceToleration(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "admit")
	fence := resourceapi.DeviceToleration{Key: api.FenceTaintKey, Operator: resourceapi.DeviceTolerationOpExists}
	keyless := resourceapi.DeviceToleration{Operator: resourceapi.DeviceTolerationOpExists}
	other := resourceapi.DeviceToleration{Key: "example.com/other", Operator: resourceapi.DeviceTolerationOpExists}
	claim := func(name string, tol resourceapi.DeviceToleration) *resourceapi.ResourceClaim {
		return builders.MakeClaim(ns, name).Toleration(tol).Obj()
	}
	for _, c := range []*resourceapi.ResourceClaim{claim("fence", fence), claim("keyless", keyless)} {
		_, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, c, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), api.FenceTaintKey) {
			t.Errorf("claim %s: want refusal naming %s, got %v", c.Name, api.FenceTaintKey, err)
		}
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "first"}, Spec: resourceapi.ResourceClaimTemplateSpec{
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: framework.Driver, Tolerations: []resourceapi.DeviceToleration{keyless}}}}}}}}}
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), api.FenceTaintKey) {
		t.Errorf("template with a keyless firstAvailable toleration: want refusal, got %v", err)
	}
	if _, err := cluster.Client.ResourceV1().ResourceClaims(ns).Create(ctx, claim("other", other), metav1.CreateOptions{}); err != nil {
		t.Errorf("a claim tolerating another taint was refused: %v", err)
	}
}

// SIGKILL the allocator in the middle of a burst of 200 claims over 50 nodes (Node objects
// and fenced slices, no kubelet): every claim is allocated once it is back, and no GPU is
// over-committed.
func TestSIGKILLDuringBurst(t *testing.T) {
	ctx := context.Background()
	o := loadgen.Defaults()
	o.Nodes, o.Claims, o.Prefix, o.Timeout = 50, 200, "e2e-burst", 3*time.Minute
	o.Namespace = "fgpu-e2e-burst"
	t.Cleanup(func() { _ = loadgen.Cleanup(context.Background(), cluster.Client, o) })
	if err := loadgen.Setup(ctx, cluster.Client, o); err != nil {
		t.Fatal(err)
	}
	before := allocatorPIDs()
	done := make(chan loadgen.Report, 1)
	go func() {
		rep, err := loadgen.Burst(ctx, cluster.Client, o)
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	time.Sleep(time.Second)
	killAllocator(t)
	rep := <-done
	t.Log(rep)
	if rep.Allocated != o.Claims {
		t.Fatalf("allocated %d of %d after the allocator was killed", rep.Allocated, o.Claims)
	}
	if rep.InvariantErr != nil {
		t.Fatal(rep.InvariantErr)
	}
	after := allocatorPIDs()
	if len(after) == 0 || (len(before) > 0 && after[0] == before[0]) {
		t.Errorf("allocator not restarted: pids before %v, after %v", before, after)
	}
}
