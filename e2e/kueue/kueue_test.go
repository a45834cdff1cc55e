package kueue

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
)

const queueLabel = "kueue.x-k8s.io/queue-name"

func gvr(resource string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: resource}
}

// createKueue creates a Kueue object from YAML and deletes it (waiting, while Kueue still
// runs to take its finalizers off) when the test ends.
func createKueue(t *testing.T, resource, ns, doc string) {
	t.Helper()
	obj := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client := dynClient.Resource(gvr(resource)).Namespace(ns)
	if _, err := client.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create %s %s: %v", resource, obj.GetName(), err)
	}
	t.Cleanup(func() {
		if err := client.Delete(ctx, obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("delete %s %s: %v", resource, obj.GetName(), err)
			return
		}
		err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := client.Get(ctx, obj.GetName(), metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
		if err != nil {
			t.Errorf("%s %s not gone", resource, obj.GetName())
		}
	})
}

// queues creates the flavor and two ClusterQueues in one cohort, each with nominal GPU memory
// quota and leave to reclaim its lent quota by preemption, and a managed namespace per queue
// with a LocalQueue "gpus" pointing at it.
func queues(t *testing.T, nominal string) (nsA, nsB string) {
	t.Helper()
	// Cleanups run last first: the namespaces (whose cleanup waits for their pods and
	// Workloads to be gone) before the ClusterQueues and the flavor, which Kueue keeps while
	// workloads use them.
	createKueue(t, "resourceflavors", "", `{apiVersion: kueue.x-k8s.io/v1beta2, kind: ResourceFlavor, metadata: {name: e2e-fgpu}}`)
	for _, q := range []string{"e2e-team-a", "e2e-team-b"} {
		createKueue(t, "clusterqueues", "", fmt.Sprintf(`apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: %s}
spec:
  cohortName: e2e-gpus
  namespaceSelector: {}
  preemption: {reclaimWithinCohort: Any, withinClusterQueue: Never}
  resourceGroups:
  - coveredResources: [%s]
    flavors:
    - name: e2e-fgpu
      resources: [{name: %s, nominalQuota: %s}]
`, q, quotaResource, quotaResource, nominal))
	}
	nsA, nsB = managedNamespace(t, "kueue-a"), managedNamespace(t, "kueue-b")
	for ns, q := range map[string]string{nsA: "e2e-team-a", nsB: "e2e-team-b"} {
		createKueue(t, "localqueues", ns, fmt.Sprintf(`{apiVersion: kueue.x-k8s.io/v1beta2, kind: LocalQueue, metadata: {name: gpus, namespace: %s}, spec: {clusterQueue: %s}}`, ns, q))
	}
	return nsA, nsB
}

func managedNamespace(t *testing.T, prefix string) string {
	t.Helper()
	ns := cluster.Namespace(t, prefix)
	cluster.LabelNamespace(t, ns, managedLabel, "managed")
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("Kueue log tail:\n%s", kueueLogTail())
		}
	})
	return ns
}

// gpuJob creates a ResourceClaimTemplate from p and a one-pod Job whose pod runs fgpu-probe
// with it, in queue (none when empty), as client.
func gpuJob(t *testing.T, client kubernetes.Interface, p *framework.GPUPod, queue string) *batchv1.Job {
	t.Helper()
	ctx := context.Background()
	tmpl := p.Template()
	if _, err := client.ResourceV1().ResourceClaimTemplates(tmpl.Namespace).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := p.Pod()
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Namespace: tmpl.Namespace, Name: tmpl.Name, Labels: map[string]string{}},
		Spec:       batchv1.JobSpec{BackoffLimit: ptr.To[int32](0), Template: corev1.PodTemplateSpec{Spec: pod.Spec}},
	}
	if queue != "" {
		job.Labels[queueLabel] = queue
	}
	job, err := client.BatchV1().Jobs(job.Namespace).Create(ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create job %s: %v", tmpl.Name, err)
	}
	return job
}

// workload is the Kueue Workload of a Job.
func workload(ctx context.Context, ns, job string) (*unstructured.Unstructured, error) {
	list, err := dynClient.Resource(gvr("workloads")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		for _, o := range list.Items[i].GetOwnerReferences() {
			if o.Kind == "Job" && o.Name == job {
				return &list.Items[i], nil
			}
		}
	}
	return nil, fmt.Errorf("no workload of job %s/%s", ns, job)
}

func condition(wl *unstructured.Unstructured, typ string) (status, reason, message string) {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == typ {
			return fmt.Sprint(m["status"]), fmt.Sprint(m["reason"]), fmt.Sprint(m["message"])
		}
	}
	return "", "", ""
}

// admitted waits for the Job's Workload to be admitted and returns the ClusterQueue and
// what Kueue charged it.
func admitted(t *testing.T, ns, job string) (string, resource.Quantity) {
	t.Helper()
	var wl *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var err error
		wl, err = workload(ctx, ns, job)
		if err != nil {
			return false, nil
		}
		s, _, _ := condition(wl, "Admitted")
		return s == "True", nil
	})
	if err != nil {
		msg := ""
		if wl != nil {
			_, _, msg = condition(wl, "QuotaReserved")
		}
		t.Fatalf("job %s/%s not admitted by Kueue: %v (QuotaReserved: %s)", ns, job, err, msg)
	}
	cq, _, _ := unstructured.NestedString(wl.Object, "status", "admission", "clusterQueue")
	psa, _, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	var charge resource.Quantity
	if len(psa) == 1 {
		m, _ := psa[0].(map[string]any)
		usage, _, _ := unstructured.NestedStringMap(m, "resourceUsage")
		charge = resource.MustParse(usage[quotaResource])
	}
	return cq, charge
}

// waitsInKueue waits until Kueue says why the Job's Workload has no quota, and checks that the
// Job stays suspended with no pod. It returns Kueue's message.
func waitsInKueue(t *testing.T, ns, job string) string {
	t.Helper()
	ctx := context.Background()
	var msg string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		wl, err := workload(ctx, ns, job)
		if err != nil {
			return false, nil
		}
		var s string
		s, _, msg = condition(wl, "QuotaReserved")
		return s == "False" && msg != "", nil
	})
	if err != nil {
		t.Fatalf("job %s/%s: Kueue did not say why it waits: %v", ns, job, err)
	}
	j, err := cluster.Client.BatchV1().Jobs(ns).Get(ctx, job, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.Suspend == nil || !*j.Spec.Suspend {
		t.Errorf("job %s/%s waits in Kueue but is not suspended", ns, job)
	}
	if pods := jobPods(t, ns, job); len(pods) > 0 {
		t.Errorf("job %s/%s waits in Kueue but has %d pod(s)", ns, job, len(pods))
	}
	return msg
}

func jobPods(t *testing.T, ns, job string) []corev1.Pod {
	t.Helper()
	list, err := cluster.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "batch.kubernetes.io/job-name=" + job})
	if err != nil {
		t.Fatal(err)
	}
	var live []corev1.Pod
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil {
			live = append(live, p)
		}
	}
	return live
}

// placement is where fgpu put a running Job pod's claim and what the pod received.
type placement struct {
	job, pod, device, gpu, limit string
	memory                       resource.Quantity
	shareID                      string
}

// placed waits for the Job's pod to run and returns fgpu's placement of its claim.
func placed(t *testing.T, ns, job string) placement {
	t.Helper()
	ctx := context.Background()
	var pod corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		pods := jobPods(t, ns, job)
		if len(pods) != 1 || pods[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		pod = pods[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("job %s/%s: no running pod: %v", ns, job, err)
	}
	claim, err := cluster.ClaimOf(ctx, &pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s/%s of running pod %s is not allocated one device: %+v", ns, claim.Name, pod.Name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	if r.Driver != framework.Driver {
		t.Fatalf("claim %s/%s got %s/%s from driver %s", ns, claim.Name, r.Pool, r.Device, r.Driver)
	}
	share := ""
	if r.ShareID != nil {
		share = string(*r.ShareID)
	}
	if _, err := cluster.WaitEvent(ctx, ns, pod.Name, "placed on ", 30*time.Second); err != nil {
		t.Errorf("pod %s/%s runs, but fgpu's allocator did not say it placed it: %v", ns, pod.Name, err)
	}
	report, err := cluster.Probe(ctx, ns, pod.Name)
	if err != nil {
		t.Fatalf("pod %s/%s: %v", ns, pod.Name, err)
	}
	return placement{job: job, pod: pod.Name, device: r.Pool + "/" + r.Device, gpu: report.Env["FGPU_GPU_UUID"],
		limit: report.Env["FGPU_MEMORY_LIMIT"], memory: r.ConsumedCapacity[api.CapacityMemory], shareID: share}
}

func clusterQueueUsage(t *testing.T, cq string) (total, borrowed string) {
	t.Helper()
	obj, err := dynClient.Resource(gvr("clusterqueues")).Get(context.Background(), cq, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	flavors, _, _ := unstructured.NestedSlice(obj.Object, "status", "flavorsUsage")
	for _, f := range flavors {
		fm, _ := f.(map[string]any)
		res, _, _ := unstructured.NestedSlice(fm, "resources")
		for _, r := range res {
			if m, _ := r.(map[string]any); m["name"] == quotaResource {
				return fmt.Sprint(m["total"]), fmt.Sprint(m["borrowed"])
			}
		}
	}
	return "0", "0"
}

func waitUsage(t *testing.T, cq, total, borrowed string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		tot, bor := clusterQueueUsage(t, cq)
		return resource.MustParse(tot).Equal(resource.MustParse(total)) && resource.MustParse(bor).Equal(resource.MustParse(borrowed)), nil
	})
	if err != nil {
		tot, bor := clusterQueueUsage(t, cq)
		t.Fatalf("ClusterQueue %s uses %s (borrowed %s), want %s (borrowed %s)", cq, tot, bor, total, borrowed)
	}
}

// Two ClusterQueues of 20Gi GPU memory each in one cohort, Jobs of 10Gi shares: team A's
// four Jobs are admitted (two of them on quota borrowed from idle team B) and fgpu places
// each admitted pod on a share of a fake GPU, with the memory Kueue charged; a fifth waits in
// Kueue, suspended; when team B submits, Kueue reclaims its lent quota by preempting one of
// A's borrowing Jobs, whose share fgpu frees, and places B's pod.
func TestQuotaBorrowingAndPlacement(t *testing.T) {
	nsA, nsB := queues(t, "20Gi")
	var got []placement
	for i := 1; i <= 4; i++ {
		job := fmt.Sprintf("a%d", i)
		gpuJob(t, cluster.Client, framework.MakeGPUPod(nsA, job).Memory("10Gi"), "gpus")
		cq, charge := admitted(t, nsA, job)
		p := placed(t, nsA, job)
		t.Logf("ADMITTED %s/%s by ClusterQueue %s, charged %s %s; fgpu PLACED it on %s (%s): share %s, consumedCapacity memory %s, FGPU_MEMORY_LIMIT=%s",
			nsA, job, cq, charge.String(), quotaResource, p.device, p.gpu, p.shareID, p.memory.String(), p.limit)
		if cq != "e2e-team-a" {
			t.Errorf("%s admitted by %s, want e2e-team-a", job, cq)
		}
		if !charge.Equal(p.memory) {
			t.Errorf("%s: Kueue charged %s but fgpu allocated %s", job, charge.String(), p.memory.String())
		}
		got = append(got, p)
	}
	total, borrowed := clusterQueueUsage(t, "e2e-team-a")
	t.Logf("BORROWING: ClusterQueue e2e-team-a uses %s of its 20Gi nominal quota, %s borrowed from cohort e2e-gpus (team B idle)", total, borrowed)
	waitUsage(t, "e2e-team-a", "40Gi", "20Gi")
	perGPU := map[string]int{}
	for _, p := range got {
		perGPU[p.device]++
	}
	if len(perGPU) >= len(got) {
		t.Errorf("4 admitted pods on %d GPUs: none shares a GPU (%v)", len(perGPU), perGPU)
	}
	t.Logf("PLACEMENTS: tenants per fake GPU %v", perGPU)

	gpuJob(t, cluster.Client, framework.MakeGPUPod(nsA, "a5").Memory("10Gi"), "gpus")
	t.Logf("WAITING %s/a5 (suspended, not admitted): %s", nsA, waitsInKueue(t, nsA, "a5"))

	// Team B wants its nominal quota back: Kueue preempts one of A's borrowing Jobs.
	gpuJob(t, cluster.Client, framework.MakeGPUPod(nsB, "b1").Memory("10Gi"), "gpus")
	cq, charge := admitted(t, nsB, "b1")
	p := placed(t, nsB, "b1")
	t.Logf("ADMITTED %s/b1 by ClusterQueue %s after reclaiming lent quota, charged %s; fgpu PLACED it on %s: consumedCapacity memory %s, FGPU_MEMORY_LIMIT=%s",
		nsB, cq, charge.String(), p.device, p.memory.String(), p.limit)
	if !charge.Equal(p.memory) {
		t.Errorf("b1: Kueue charged %s but fgpu allocated %s", charge.String(), p.memory.String())
	}
	for i := 1; i <= 5; i++ {
		job := fmt.Sprintf("a%d", i)
		wl, err := workload(context.Background(), nsA, job)
		if err != nil {
			t.Fatal(err)
		}
		if s, reason, msg := condition(wl, "Evicted"); s == "True" {
			t.Logf("PREEMPTED %s/%s: %s: %s", nsA, job, reason, msg)
		}
	}
	waitUsage(t, "e2e-team-a", "30Gi", "10Gi")
	waitUsage(t, "e2e-team-b", "10Gi", "0")
	total, borrowed = clusterQueueUsage(t, "e2e-team-a")
	t.Logf("BORROWING: after the reclaim ClusterQueue e2e-team-a uses %s, %s borrowed", total, borrowed)
}

// Kueue charges a claim the memory fgpu allocates it: a share its memory rounded up to
// fgpu's 256Mi step (the device's requestPolicy), a claim of the exclusive class (which names
// no memory) the whole GPU's memory, never less.
func TestChargeIsWhatFgpuAllocates(t *testing.T) {
	nsA, _ := queues(t, "100Gi")
	gpuJob(t, cluster.Client, framework.MakeGPUPod(nsA, "odd").Memory("1000Mi"), "gpus")
	gpuJob(t, cluster.Client, framework.MakeGPUPod(nsA, "whole").Class(api.DeviceClassExclusive), "gpus")
	for _, job := range []string{"odd", "whole"} {
		_, charge := admitted(t, nsA, job)
		p := placed(t, nsA, job)
		t.Logf("CHARGE %s/%s: Kueue charged %s, fgpu allocated %s on %s (FGPU_MEMORY_LIMIT=%s)", nsA, job, charge.String(), p.memory.String(), p.device, p.limit)
		if !charge.Equal(p.memory) {
			t.Errorf("%s: Kueue charged %s but fgpu allocated %s", job, charge.String(), p.memory.String())
		}
	}
	if _, charge := admitted(t, nsA, "odd"); !charge.Equal(resource.MustParse("1024Mi")) {
		t.Errorf("1000Mi charged %s, want 1024Mi (fgpu's step)", charge.String())
	}
}

// A tenant with `edit` in a Kueue-managed namespace tries to use an fgpu GPU without Kueue's
// quota: a Job without a queue name stays suspended; a bare Pod without one is gated by Kueue
// and fgpu places nothing for its claim; a queued Job whose pod names a ResourceClaim the
// tenant created directly (which Kueue would not charge) is never admitted.
func TestTenantCannotBypassKueue(t *testing.T) {
	_, nsB := queues(t, "20Gi")
	tn := cluster.Tenant(t, nsB, "tenant")
	ctx := context.Background()

	gpuJob(t, tn.Client, framework.MakeGPUPod(nsB, "unqueued").Memory("10Gi"), "")
	time.Sleep(5 * time.Second)
	j, err := cluster.Client.BatchV1().Jobs(nsB).Get(ctx, "unqueued", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if j.Spec.Suspend == nil || !*j.Spec.Suspend || len(jobPods(t, nsB, "unqueued")) > 0 {
		t.Errorf("a Job without a queue name in a managed namespace runs: suspend=%v, %d pod(s)", j.Spec.Suspend, len(jobPods(t, nsB, "unqueued")))
	}
	t.Logf("BYPASS job without queue name: suspended=%v, pods=%d", *j.Spec.Suspend, len(jobPods(t, nsB, "unqueued")))

	bare := framework.MakeGPUPod(nsB, "bare").Memory("10Gi")
	pod, err := bare.CreateAs(ctx, tn.Client)
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.SchedulingGates) == 0 {
		t.Fatalf("Kueue did not gate a bare pod without a queue name in a managed namespace")
	}
	// kube-controller-manager makes the pod's claim while the pod is gated: fgpu must leave it.
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatalf("no claim for the gated pod: %v", err)
	}
	time.Sleep(10 * time.Second)
	if claim, err = cluster.Client.ResourceV1().ResourceClaims(nsB).Get(ctx, claim.Name, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Errorf("fgpu placed claim %s of a pod Kueue has not admitted (gates %v)", claim.Name, pod.Spec.SchedulingGates)
	}
	t.Logf("BYPASS bare pod without queue name: gates %v, claim %s allocated=%v after 10s", pod.Spec.SchedulingGates, claim.Name, claim.Status.Allocation != nil)

	// Edit may update pods, and Kueue's webhook lets the gate go; Kueue then deletes the pod
	// it never admitted.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := tn.Client.CoreV1().Pods(nsB).Get(ctx, "bare", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Spec.SchedulingGates = nil
		_, err = tn.Client.CoreV1().Pods(nsB).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("the tenant could not remove Kueue's gate: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(nsB).Get(ctx, "bare", metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), nil
	})
	if err != nil {
		t.Errorf("Kueue did not delete the pod whose gate the tenant removed: %v", err)
	}
	t.Logf("BYPASS tenant removed Kueue's scheduling gate: Kueue deleted the pod")

	direct := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "direct"}, Spec: framework.MakeGPUPod(nsB, "direct").Memory("60Gi").Template().Spec.Spec}
	if _, err := tn.Client.ResourceV1().ResourceClaims(nsB).Create(ctx, direct, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spec := framework.MakeGPUPod(nsB, "direct").Pod().Spec
	spec.RestartPolicy = corev1.RestartPolicyNever
	spec.ResourceClaims[0].ResourceClaimTemplateName, spec.ResourceClaims[0].ResourceClaimName = nil, ptr.To("direct")
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: nsB, Name: "direct", Labels: map[string]string{queueLabel: "gpus"}},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: spec}}}
	if _, err := tn.Client.BatchV1().Jobs(nsB).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := waitsInKueue(t, nsB, "direct")
	if !strings.Contains(msg, "resource claims") {
		t.Errorf("Kueue's reason for a Job with a direct claim: %q", msg)
	}
	t.Logf("BYPASS job with a directly created 60Gi claim (Kueue would not charge it): %s", msg)
}
