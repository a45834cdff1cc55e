package allocator

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller"
)

// An opted-in Deployment whose two 10Gi pods play no SM activity for a minute is scaled to
// zero, told in an event, and keeps its 20Gi of its namespace's 20Gi quota: a new 10Gi claim
// there waits and is told why, while the same claim in another namespace under the same
// policy is placed. `kubectl fgpu wake` brings back its two replicas, the allocator drops
// the annotations, and the waiting claim is placed. (The suite's plugin reports usage every
// 5 s, so a minute of idleness is a dozen reports.)
func TestIdleDeploymentScaledToZeroKeepsItsQuota(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "idle")
	other := cluster.Namespace(t, "idle-other")
	for _, n := range []string{ns, other} {
		cluster.LabelNamespace(t, n, "fgpu.dev/e2e-idle", ns)
	}
	createPolicy(t, builders.MakePolicy("idle-"+ns).Priority(10).Namespaces("fgpu.dev/e2e-idle", ns).
		IdleScaleDown(time.Minute).QuotaMemory("20Gi").Obj())
	gp := framework.MakeGPUPod(ns, "web").Memory("10Gi")
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, gp.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := replayPod(ns, "web", "10Gi", "0:1Gi:0")
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web", Annotations: map[string]string{api.AnnotationIdleScaleDown: "true"}},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](2), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec}},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods, err := waitWebPods(ctx, ns, 2, 2*time.Minute)
	if err != nil {
		t.Fatalf("the Deployment's two pods did not run: %v", err)
	}
	// No usage of a pod is measured before it was created.
	var start time.Time
	for _, p := range pods {
		if c := p.CreationTimestamp.Time; c.After(start) {
			start = c
		}
	}

	// A minute of idle reports, then the allocator's next pass (every 30 s).
	var d *appsv1.Deployment
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		d, err = cluster.Client.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		return err == nil && ptr.Deref(d.Spec.Replicas, 1) == 0, nil
	}); err != nil {
		t.Fatal("the idle Deployment was not scaled to zero within 3 minutes")
	}
	idleFor := time.Since(start)
	t.Logf("scaled to zero %s after the second pod was created", idleFor.Round(time.Second))
	if idleFor < time.Minute {
		t.Errorf("scaled to zero after %s; want a minute of idle reports first", idleFor)
	}
	if got := d.Annotations[api.AnnotationScaledDownReplicas]; got != "2" {
		t.Errorf("annotation %s=%q; want 2", api.AnnotationScaledDownReplicas, got)
	}
	var reserve api.IdleReserve
	if err := json.Unmarshal([]byte(d.Annotations[api.AnnotationScaledDownReserve]), &reserve); err != nil || reserve.Memory.String() != "20Gi" {
		t.Errorf("annotation %s=%q; want 20Gi of memory", api.AnnotationScaledDownReserve, d.Annotations[api.AnnotationScaledDownReserve])
	}
	ev, err := cluster.WaitEvent(ctx, ns, "web", "scaled from 2 replicas to zero", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	if !strings.HasPrefix(ev, controller.ReasonScaledToZero+":") || !strings.Contains(ev, "keeps 20Gi") || !strings.Contains(ev, "fgpu wake deployment/web -n "+ns) {
		t.Errorf("event %q does not say what is kept and how to wake it", ev)
	}
	if _, err := waitWebPods(ctx, ns, 0, 2*time.Minute); err != nil {
		t.Fatalf("the Deployment's pods are not gone: %v", err)
	}
	// Their claims go with them, so the namespace's use is the reserve alone.
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		claims, err := cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(claims.Items) == 0, nil
	}); err != nil {
		t.Fatal("the Deployment's claims are not gone")
	}

	// Its namespace's quota is kept for it; another namespace's is not touched.
	for _, n := range []string{ns, other} {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(n, "late").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.WaitRunning(ctx, other, "late", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	ev, err = cluster.WaitEvent(ctx, ns, "late", "kept for workloads scaled to zero", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	if !strings.Contains(ev, "20Gi of it kept") || !strings.Contains(ev, "10Gi over") {
		t.Errorf("quota event %q does not say how much is kept and by how much the claim is over", ev)
	}
	late, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "late", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := cluster.ClaimOf(ctx, late)
	if err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err == nil {
			claim = c
		}
		return strings.Contains(claim.Annotations[api.AnnotationStatus], "kept for workloads scaled to zero"), nil
	}); err != nil {
		t.Errorf("claim %s's status %q does not say the quota is kept for a workload scaled to zero", claim.Name, claim.Annotations[api.AnnotationStatus])
	}
	waitPending(t, ns, "late", 2*time.Second)

	// fgpu wake restores the replicas; the reserve goes with the annotations and the
	// waiting claim, the oldest, is placed first.
	out := kubectlFgpu(t, buildKubectlFgpu(t), "wake", "deployment/web", "-n", ns)
	if !strings.Contains(out, "deployment/web scaled to 2 replicas") {
		t.Errorf("kubectl fgpu wake said %q", out)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err = cluster.Client.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		_, r := d.Annotations[api.AnnotationScaledDownReplicas]
		_, q := d.Annotations[api.AnnotationScaledDownReserve]
		return !r && !q, nil
	}); err != nil {
		t.Fatalf("the scale-down annotations stayed on the woken Deployment: %v", d.Annotations)
	}
	if r := ptr.Deref(d.Spec.Replicas, 1); r != 2 {
		t.Errorf("woken Deployment has %d replicas; want 2", r)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "late", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	// With late placed the quota has room for one web pod; once late goes, both run.
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "late", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := waitWebPods(ctx, ns, 2, 2*time.Minute); err != nil {
		t.Fatalf("the woken Deployment's two pods did not run: %v", err)
	}
	checkInvariant(t)
}

// waitWebPods waits until the namespace has exactly n pods of app=web, all running, and
// returns them.
func waitWebPods(ctx context.Context, ns string, n int, timeout time.Duration) ([]corev1.Pod, error) {
	var found []corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, time.Second, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(pods.Items) != n {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				return false, nil
			}
		}
		found = pods.Items
		return true, nil
	})
	return found, err
}
