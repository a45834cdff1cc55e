package allocator

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

const gpuResource corev1.ResourceName = "nvidia.com/gpu"

// devicePluginPod is a pod as written for NVIDIA's device plugin: no claim, gpus of
// nvidia.com/gpu in its limits; its fgpu-probe replays steps on whatever GPU it gets.
func devicePluginPod(ns, name, steps string, gpus int64) *corev1.Pod {
	p := replayPod(ns, name, "", steps)
	p.Spec.ResourceClaims = nil
	c := &p.Spec.Containers[0]
	c.Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{gpuResource: *resource.NewQuantity(gpus, resource.DecimalSI)}}
	return p
}

// devicePluginDeployment is one replica of devicePluginPod, its pods labelled app=name.
func devicePluginDeployment(t *testing.T, ns, name, steps string) {
	t.Helper()
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: devicePluginPod(ns, name, steps, 1).Spec}},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(context.Background(), dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// runningPod waits for the one running pod labelled app=name that is not old, and returns it.
func runningPod(t *testing.T, ns, name, old string) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + name})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Name != old && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
				pod = p
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no running pod of Deployment %s/%s", ns, name)
	}
	return pod
}

// Two Deployments written for NVIDIA's device plugin (nvidia.com/gpu: 1, no claim) run on
// fgpu unchanged: each pod gets a claim of one whole GPU from the template the allocator
// keeps, so the two hold both GPUs. Under sizing Auto, once their use is measured, their next
// pods are right-sized shares and share one GPU, with MPS caps of the recommended size.
func TestDevicePluginWorkloadsRunUnchangedAndShareOnceSized(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "devplugin")
	cluster.LabelNamespace(t, ns, "fgpu.dev/e2e-sizing", ns)
	createPolicy(t, builders.MakePolicy("sizing-"+ns).Namespaces("fgpu.dev/e2e-sizing", ns).Sizing(api.SizingAuto).Obj())
	for _, name := range []string{"train", "serve"} {
		devicePluginDeployment(t, ns, name, "0:2Gi:20")
	}

	before := map[string]string{}
	for _, name := range []string{"train", "serve"} {
		pod := runningPod(t, ns, name, "")
		if pod.Labels[api.LabelExtendedResource] != "true" || len(pod.Spec.ResourceClaims) != 1 ||
			ptr.Deref(pod.Spec.ResourceClaims[0].ResourceClaimTemplateName, "") != "fgpu-gpu-1" {
			t.Fatalf("pod %s was not rewritten to a claim of fgpu-gpu-1: labels %v, claims %+v", pod.Name, pod.Labels, pod.Spec.ResourceClaims)
		}
		if _, asks := pod.Spec.Containers[0].Resources.Limits[gpuResource]; asks {
			t.Errorf("pod %s still asks for %s", pod.Name, gpuResource)
		}
		gpu, claim := gpuOf(t, pod)
		before[name] = gpu
		if got := claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]; got.Cmp(resource.MustParse("40Gi")) < 0 {
			t.Errorf("pod %s's claim got %s of memory; want the whole GPU", pod.Name, got.String())
		}
		report, err := cluster.Probe(ctx, ns, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if report.Env["FGPU_DEVICE"] != gpu || report.Env["FGPU_MEMORY_CAP"] != "whole-gpu" {
			t.Errorf("pod %s received device %q, cap %q; want %s, whole-gpu", pod.Name, report.Env["FGPU_DEVICE"], report.Env["FGPU_MEMORY_CAP"], gpu)
		}
		if _, err := cluster.WaitEvent(ctx, ns, claim.Name, "Deployment "+ns+"/"+name+" request gpu: recommended memory", 2*time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if before["train"] == before["serve"] {
		t.Fatalf("two whole GPUs on one GPU %s", before["train"])
	}
	// The report, as a platform team reads it: two GPUs held, one needed at the measured sizes.
	kubectlDir := buildKubectlFgpu(t)
	if r := usageReport(t, kubectlDir, ns); r.GPUsHeld != 2 || r.GPUsNeeded == nil || *r.GPUsNeeded != 1 || r.MeasuredWorkloads != 2 {
		t.Errorf("report before: %d GPUs held, %v needed, %d workloads measured; want 2, 1, 2", r.GPUsHeld, r.GPUsNeeded, r.MeasuredWorkloads)
	}
	// A window with no usage report in it says so, and shows no zeros. A report written while
	// the command reads may fall in even 1ms; such a try is taken again.
	emptyWindow := false
	for try := 0; try < 5 && !emptyWindow; try++ {
		r := usageReport(t, kubectlDir, ns, "--since", "1ms")
		out := kubectlFgpu(t, kubectlDir, "report", "-n", ns, "--since", "1ms")
		if r.MeasuredWorkloads > 0 || !strings.Contains(out, "no GPU use measured") {
			continue
		}
		emptyWindow = true
		if r.GPUsNeeded != nil || len(r.Notes) == 0 || !strings.HasPrefix(r.Notes[0], "no GPU use measured in the last 1ms") ||
			slices.ContainsFunc(r.Workloads, func(w clusterview.WorkloadReport) bool { return w.Used != nil }) {
			t.Errorf("report -o json over 1ms: %v needed, notes %q, workloads %+v; want none needed or used, and a note that says so", r.GPUsNeeded, r.Notes, r.Workloads)
		}
		if !strings.Contains(out, "not measured") || strings.Contains(out, "0Ki") {
			t.Errorf("report over 1ms:\n%s\nwant \"not measured\" and no zeros", out)
		}
	}
	if !emptyWindow {
		t.Error("every report over 1ms found a usage report in it")
	}

	// A rollout (as Auto's shrink does after --sizing-shrink-after) brings the pods back at
	// their recommended size: shares, side by side.
	after := map[string]string{}
	for _, name := range []string{"train", "serve"} {
		old := runningPod(t, ns, name, "")
		if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		pod := runningPod(t, ns, name, old.Name)
		gpu, claim := gpuOf(t, pod)
		after[name] = gpu
		got := claim.Status.Allocation.Devices.Results[0].ConsumedCapacity[api.CapacityMemory]
		if got.Cmp(resource.MustParse("2Gi")) < 0 || got.Cmp(resource.MustParse("4Gi")) > 0 {
			t.Errorf("pod %s's claim got %s; want its recommendation above the 2Gi it uses", pod.Name, got.String())
		}
		report, err := cluster.Probe(ctx, ns, pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if cap := report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; !strings.HasPrefix(cap, "0=") {
			t.Errorf("pod %s's MPS memory cap %q; want one of its size", pod.Name, cap)
		}
	}
	if after["train"] != after["serve"] {
		t.Errorf("right-sized pods on GPUs %s and %s; want them sharing one", after["train"], after["serve"])
	}
	// The old pods' whole GPUs count until those pods are gone.
	var held int
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		held = usageReport(t, kubectlDir, ns).GPUsHeld
		return held == 1, nil
	}); err != nil {
		t.Errorf("report after: %d GPUs held; want the 1 both share", held)
	}
	checkInvariant(t)
}

// What fgpu cannot serve is said where the user sees it: a count that is not 1 to 32 is
// refused at admission, and a count no node has waits with the allocator's reason on the pod.
func TestDevicePluginRequestsFgpuCannotServeSayWhy(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "devplugin-bad")
	_, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, "many", "0:1Gi:10", 33), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "from 1 to 32") {
		t.Errorf("a pod asking for 33 %s: %v; want a refusal that says 1 to 32", gpuResource, err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, "three", "0:1Gi:10", 3), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "three", "no GPU can take 3 × a whole GPU", time.Minute); err != nil {
		t.Fatal(err)
	}

	// A namespace an admin leaves to another device plugin is not rewritten.
	other := cluster.Namespace(t, "devplugin-off")
	cluster.LabelNamespace(t, other, api.LabelExtendedResource, "false")
	pod, err := cluster.Client.CoreV1().Pods(other).Create(ctx, devicePluginPod(other, "left", "0:1Gi:10", 1), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.ResourceClaims) != 0 || pod.Spec.Containers[0].Resources.Limits.Name(gpuResource, resource.DecimalSI).Value() != 1 {
		t.Errorf("a pod of a namespace labelled %s=false was rewritten: %+v", api.LabelExtendedResource, pod.Spec)
	}
}

// A GPU pod that runs before fgpu is installed (here a device plugin's: a process on fake GPU
// 0 that fgpu did not start) is not restarted by the install, and its GPU is not offered while
// it runs: an unchanged nvidia.com/gpu pod created then gets the other GPU. When the device
// plugin's pod ends, its GPU passes to fgpu, and the next such pod gets it.
func TestInstallRestartsNoRunningGPUPodAndTakesItsGPUOnlyOnceFree(t *testing.T) {
	ctx := context.Background()
	reinstall := func() {
		if err := cluster.Install(ctx, suiteValues...); err != nil {
			t.Fatalf("installing the chart: %v", err)
		}
		if err := cluster.WaitAllocatorReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := cluster.Uninstall(ctx); err != nil {
		t.Fatal(err)
	}
	// As on a cluster fgpu never ran on: the kubelet would delete the gone plugin's slices
	// only later, and until the new plugin publishes its own the allocator would place on them.
	if err := cluster.Client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{},
		metav1.ListOptions{FieldSelector: "spec.nodeName=" + cluster.Node + ",spec.driver=" + framework.Driver}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			reinstall()
		}
	})
	ns := cluster.Namespace(t, "handover")
	// Not rewritten: the chart (and its admission policy) is not installed yet.
	old := devicePluginPod(ns, "old", "0:20Gi:60", 1)
	old.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	old.Spec.Containers[0].Args = append(old.Spec.Containers[0].Args, "--gpu", "0")
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	before, err := cluster.WaitRunning(ctx, ns, "old", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	reinstall()
	waitForeignTaint(t, "gpu-0", "the old pod")
	after, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "old", metav1.GetOptions{})
	if err != nil || after.UID != before.UID || after.Status.Phase != corev1.PodRunning || after.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Fatalf("the GPU pod that ran before the install: %v; want it untouched", err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, "new", "0:1Gi:10", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.WaitRunning(ctx, ns, "new", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if gpu, _ := gpuOf(t, pod); gpu != "gpu-1" {
		t.Errorf("the new pod got %s; want gpu-1, the GPU the old pod does not use", gpu)
	}

	// The old pod ends: its GPU passes to fgpu.
	if err := cluster.Client.CoreV1().Pods(ns).Delete(ctx, "old", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, devicePluginPod(ns, "next", "0:1Gi:10", 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err = cluster.WaitRunning(ctx, ns, "next", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if gpu, _ := gpuOf(t, pod); gpu != "gpu-0" {
		t.Errorf("the next pod got %s; want gpu-0, free once the old pod ended", gpu)
	}
	checkInvariant(t)
}

// usageReport is `kubectl fgpu report -n ns -o json` and args, read as a script reads it.
func usageReport(t *testing.T, kubectlDir, ns string, args ...string) clusterview.UsageReport {
	t.Helper()
	var r clusterview.UsageReport
	if err := json.Unmarshal([]byte(kubectlFgpu(t, kubectlDir, append([]string{"report", "-n", ns, "-o", "json"}, args...)...)), &r); err != nil {
		t.Fatalf("kubectl fgpu report -o json: %v", err)
	}
	return r
}

// waitForeignTaint waits until device is published as busy with processes fgpu did not start
// (user's), so that fgpu offers no share of it.
func waitForeignTaint(t *testing.T, device, user string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + cluster.Node})
		if err != nil {
			return false, nil
		}
		for _, sl := range list.Items {
			for _, d := range sl.Spec.Devices {
				if d.Name == device && slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == api.ForeignTaintKey }) {
					return true, nil
				}
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("%s, which %s uses, is not published with the foreign-processes taint", device, user)
	}
}
