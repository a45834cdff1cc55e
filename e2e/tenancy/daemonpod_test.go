package tenancy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	resourcehelper "k8s.io/component-helpers/resource"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// A tenant that fills its node's CPU requests with ordinary pods must not keep another
// namespace's GPU pod from starting (issue #24, finding 5): the kubelet admits a pod bound to
// its node only if its requests fit, so the new domain's MPS daemon pod requests nothing (the
// plugin's own pod requests its room) and starts on the full node.
func TestFullNodeStillStartsAnotherNamespacesMPSDaemon(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	fillerNS, lateNS := cluster.Namespace(t, "filler"), cluster.Namespace(t, "late")
	tenant := cluster.Tenant(t, fillerNS, "tenant")
	if free := freeCPU(t); free.Sign() > 0 {
		filler := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: fillerNS, Name: "filler"},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				Containers: []corev1.Container{{
					Name: "c", Image: framework.Image, ImagePullPolicy: corev1.PullNever, Command: []string{"/usr/bin/fgpu-probe"},
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: free}},
				}},
			},
		}
		if _, err := tenant.Client.CoreV1().Pods(fillerNS).Create(ctx, filler, metav1.CreateOptions{}); err != nil {
			t.Fatalf("the tenant creates a pod requesting the node's free CPU (%s): %v", free.String(), err)
		}
		running(t, fillerNS, "filler")
	}
	if free := freeCPU(t); free.Sign() > 0 {
		t.Fatalf("the node still has %s CPU to request", free.String())
	}

	if _, err := cluster.Create(ctx, framework.MakeGPUPod(lateNS, "gpu").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	running(t, lateNS, "gpu")
	daemon := daemonOf(t, lateNS, "gpu")
	if daemon.Status.Phase != corev1.PodRunning {
		t.Errorf("the new domain's daemon pod %s is %s", daemon.Name, daemon.Status.Phase)
	}
	if r := resourcehelper.PodRequests(daemon, resourcehelper.PodResourcesOptions{}); !r.Cpu().IsZero() || !r.Memory().IsZero() {
		t.Errorf("the daemon pod requests %v; want nothing a full node cannot admit", r)
	}
	// The new domain may have taken the spare daemon started before the node was full; the
	// spare started behind it, on the full node, must run too.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		st, err := framework.ReadNodeState()
		if err != nil || len(st.Spares) != 2 {
			return false, nil
		}
		for _, key := range st.Spares {
			pods, err := cluster.Client.CoreV1().Pods(framework.Namespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelMPSDaemon + "=" + key})
			if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		t.Error("no running spare MPS daemon on each GPU of the full node")
	}
	healthy(t, fillerNS, lateNS)
}

// A drain evicts pods through the Eviction API, which honours PodDisruptionBudgets: it must
// not take the MPS server of a tenant whose budget forbids taking the tenant (issue #24,
// finding 7). The daemon's pod is refused eviction while the tenant's pod runs, as the tenant's
// is; once the tenant's pod is gone the plugin deletes the daemon and its budget, and a drain
// ends.
func TestDrainCannotEvictTheMPSServerOfAPodItMayNotEvict(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	ns := cluster.Namespace(t, "drain")
	tenant := cluster.Tenant(t, ns, "tenant")
	gp := framework.MakeGPUPod(ns, "web").Memory("10Gi")
	if _, err := tenant.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, gp.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: gp.Pod().Spec}},
	}
	if _, err := tenant.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(1)), Selector: &metav1.LabelSelector{MatchLabels: labels}}}
	if _, err := tenant.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var web *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		web = &pods.Items[0]
		return true, nil
	}); err != nil {
		t.Fatalf("the Deployment's pod does not run: %v", err)
	}
	daemon := daemonOf(t, ns, web.Name)
	// Both budgets as the disruption controller sees them: an eviction before that is refused
	// whatever they say.
	synced(t, ns, "web")
	synced(t, framework.Namespace, daemon.Name)

	evict := func(p *corev1.Pod) error {
		return cluster.Client.CoreV1().Pods(p.Namespace).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name}})
	}
	if err := evict(web); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting the tenant's pod: %v; want it refused by its budget", err)
	}
	if err := evict(daemon); !apierrors.IsTooManyRequests(err) {
		t.Fatalf("evicting the MPS daemon pod of a tenant its budget keeps: %v; want it refused", err)
	} else {
		t.Logf("the daemon's eviction was refused: %v", err)
	}
	now, err := cluster.Client.CoreV1().Pods(framework.Namespace).Get(ctx, daemon.Name, metav1.GetOptions{})
	if err != nil || now.UID != daemon.UID || now.DeletionTimestamp != nil {
		t.Fatalf("the daemon pod was taken all the same (%v)", err)
	}

	// The tenant leaves; its daemon goes after it, budget and all.
	if err := tenant.Client.AppsV1().Deployments(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		_, podErr := cluster.Client.CoreV1().Pods(framework.Namespace).Get(ctx, daemon.Name, metav1.GetOptions{})
		_, budgetErr := cluster.Client.PolicyV1().PodDisruptionBudgets(framework.Namespace).Get(ctx, daemon.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(podErr) && apierrors.IsNotFound(budgetErr), nil
	}); err != nil {
		t.Fatalf("the daemon pod %s or its budget is still there %s after its last client went", daemon.Name, podTimeout)
	}
	if ev := eventsOf(ns, web.Name); strings.Contains(ev, "FgpuMPSServerLost") {
		t.Errorf("the tenant's pod lost its MPS server:\n%s", ev)
	}
	healthy(t, ns)
}

// freeCPU is the CPU that pods may still request on the node.
func freeCPU(t *testing.T) resource.Quantity {
	t.Helper()
	ctx := context.Background()
	node, err := cluster.Client.CoreV1().Nodes().Get(ctx, cluster.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cluster.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + cluster.Node})
	if err != nil {
		t.Fatal(err)
	}
	free := node.Status.Allocatable.Cpu().DeepCopy()
	for _, p := range pods.Items {
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			requests := resourcehelper.PodRequests(&p, resourcehelper.PodResourcesOptions{})
			free.Sub(*requests.Cpu())
		}
	}
	return free
}

// daemonOf is the MPS daemon pod that serves a running pod's claim.
func daemonOf(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	pipe := probe(t, ns, name).Env["CUDA_MPS_PIPE_DIRECTORY"]
	if pipe == "" {
		t.Fatalf("pod %s/%s has no MPS pipe directory", ns, name)
	}
	p := daemonPodOf(t, pipe)
	return &p
}

// synced waits until the disruption controller has computed a budget's status.
func synced(t *testing.T, ns, name string) {
	t.Helper()
	var b *policyv1.PodDisruptionBudget
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		var err error
		b, err = cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && b.Status.ObservedGeneration == b.Generation && b.Status.ExpectedPods == 1, nil
	}); err != nil {
		t.Fatalf("the disruption budget %s/%s is not synced: %+v", ns, name, b)
	}
}

// The spare MPS daemon a namespace's first claim took is never handed on: once the tenant's
// pod is gone its daemon and directories go too, and the next namespace's first claim gets a
// spare of its own, which no one used before.
func TestSpareDaemonServesOneDomainOnly(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	first, second := cluster.Namespace(t, "took"), cluster.Namespace(t, "next")
	// keyOf waits for a ready spare on each GPU, then runs a pod in ns and returns its
	// daemon's key.
	keyOf := func(ns string) string {
		t.Helper()
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
			st, err := framework.ReadNodeState()
			return err == nil && len(st.ReadySpares) == 2, nil
		}); err != nil {
			t.Fatal("no ready spare MPS daemon on each GPU")
		}
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "gpu").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
		running(t, ns, "gpu")
		pipe := probe(t, ns, "gpu").Env["CUDA_MPS_PIPE_DIRECTORY"]
		key := filepath.Base(filepath.Dir(pipe))
		if !strings.HasPrefix(key, mps.SparePrefix) {
			t.Errorf("namespace %s's first claim waited for a daemon of its own (%s), not a spare", ns, key)
		}
		return key
	}
	a := keyOf(first)
	if err := cluster.Client.CoreV1().Pods(first).Delete(ctx, "gpu", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(filepath.Join(framework.StateDir, "mps", a))
		return os.IsNotExist(err), nil
	}); err != nil {
		t.Fatalf("namespace %s's daemon %s is still there after its pod", first, a)
	}
	if b := keyOf(second); b == a {
		t.Errorf("namespace %s got %s, the daemon namespace %s used", second, b, first)
	}
}
