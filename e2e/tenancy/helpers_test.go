package tenancy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// policyLabel marks the suite's SharingPolicies for deletePolicies.
const policyLabel = "fgpu.dev/e2e-tenancy"

// podTimeout bounds every wait for a pod that must run: long enough for the 2-core machine,
// short enough that an attack that leaves a pod stuck fails the test instead of hanging it.
const podTimeout = 90 * time.Second

// createPolicy creates a SharingPolicy for the duration of the test.
func createPolicy(t *testing.T, p *api.SharingPolicy) {
	t.Helper()
	ctx := context.Background()
	p.Labels = map[string]string{policyLabel: "true"}
	if _, err := fgpuClient.FgpuV1alpha1().SharingPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fgpuClient.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	})
	time.Sleep(time.Second) // the allocator's informer
}

func deletePolicies(ctx context.Context) {
	_ = fgpuClient.FgpuV1alpha1().SharingPolicies().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: policyLabel + "=true"})
}

// namespaces creates n test namespaces that all carry the label key=<first namespace's
// name>, so that one policy selects exactly them.
func namespaces(t *testing.T, prefix, key string, n int) []string {
	t.Helper()
	var nss []string
	for i := 0; i < n; i++ {
		nss = append(nss, cluster.Namespace(t, prefix))
	}
	for _, ns := range nss {
		cluster.LabelNamespace(t, ns, key, nss[0])
	}
	return nss
}

// running waits for a pod to run; on timeout the error carries what its events say.
func running(t *testing.T, ns, name string) *corev1.Pod {
	t.Helper()
	pod, err := cluster.WaitRunning(context.Background(), ns, name, podTimeout)
	if err != nil {
		t.Fatalf("%v\n%s", err, eventsOf(ns, name))
	}
	return pod
}

// eventsOf is the events about an object, for failure messages.
func eventsOf(ns, name string) string {
	events, err := cluster.Client.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range events.Items {
		fmt.Fprintf(&b, "  event %s/%s %s: %s\n", e.InvolvedObject.Kind, name, e.Reason, e.Message)
	}
	return b.String()
}

// probe is what fgpu-probe printed in a running pod.
func probe(t *testing.T, ns, name string) framework.ProbeReport {
	t.Helper()
	r, err := cluster.Probe(context.Background(), ns, name)
	if err != nil {
		t.Fatalf("probe of %s/%s: %v", ns, name, err)
	}
	return r
}

// gpuOf is the device the pod's claim was allocated.
func gpuOf(t *testing.T, pod *corev1.Pod) (string, *resourceapi.ResourceClaim) {
	t.Helper()
	claim, err := cluster.ClaimOf(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil {
		t.Fatalf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	return claim.Status.Allocation.Devices.Results[0].Device, claim
}

// inNamespace says whether an isolation domain belongs to ns: the namespace's own domain
// or a subdivision of it ("<ns>/<sub>").
func inNamespace(domain, ns string) bool {
	return domain == ns || strings.HasPrefix(domain, ns+"/")
}

// waitClaimStatus waits for the fgpu.dev/status annotation of the pod's claim to contain
// every one of substrs, and returns it.
func waitClaimStatus(t *testing.T, pod *corev1.Pod, timeout time.Duration, substrs ...string) string {
	t.Helper()
	ctx := context.Background()
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	var msg string
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		msg = c.Annotations[api.AnnotationStatus]
		for _, s := range substrs {
			if !strings.Contains(msg, s) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("claim %s/%s: status %q does not say %q within %s\n%s", claim.Namespace, claim.Name, msg, substrs, timeout, eventsOf(pod.Namespace, pod.Name))
	}
	return msg
}

// notAllocated checks that the pod's claim holds nothing and the pod is not bound.
func notAllocated(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Errorf("claim %s/%s was allocated %v", claim.Namespace, claim.Name, claim.Status.Allocation.Devices.Results)
	}
	p, err := cluster.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Errorf("pod %s/%s was bound to %s", p.Namespace, p.Name, p.Spec.NodeName)
	}
}

// healthy is what every test ends with: the invariant checker finds no GPU over its memory
// or compute (over the live claims and slices), and no pod of the namespaces is bound to
// the node without running (ContainerCreating: a prepare that failed and is retried forever).
func healthy(t *testing.T, nss ...string) {
	t.Helper()
	ctx := context.Background()
	if err := loadgen.Check(ctx, cluster.Client, framework.Driver); err != nil {
		t.Errorf("invariant: %v", err)
	}
	for _, ns := range nss {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			if p.Spec.NodeName != "" && p.Status.Phase == corev1.PodPending && p.DeletionTimestamp == nil {
				t.Errorf("pod %s/%s is stuck on %s in %s\n%s", ns, p.Name, p.Spec.NodeName, waiting(&p), eventsOf(ns, p.Name))
			}
		}
	}
}

func waiting(p *corev1.Pod) string {
	for _, s := range p.Status.ContainerStatuses {
		if s.State.Waiting != nil {
			return s.State.Waiting.Reason
		}
	}
	return string(p.Status.Phase)
}

// restartAllocator deletes the allocator's pod and waits for its replacement to run.
func restartAllocator(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=allocator"}
	old, err := cluster.Client.CoreV1().Pods(framework.Namespace).List(ctx, sel)
	if err != nil || len(old.Items) == 0 {
		t.Fatalf("no allocator pod: %v", err)
	}
	zero := int64(0)
	for _, p := range old.Items {
		if err := cluster.Client.CoreV1().Pods(framework.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(framework.Namespace).List(ctx, sel)
		if err != nil {
			return false, nil
		}
		for _, p := range pods.Items {
			if p.UID != old.Items[0].UID && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && ready(&p) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("the allocator did not come back: %v", err)
	}
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
