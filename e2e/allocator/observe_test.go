package allocator

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

// Observe mode: a GPU pod fgpu did not place (here as NVIDIA's device plugin's would: its
// process on fake GPU 1, in a namespace that keeps its nvidia.com/gpu pods away from fgpu)
// is measured by the kubelet plugin into its node's ConfigMap, sized by the allocator like
// fgpu's own claims (the recommendation is told on the pod), and counted by `kubectl fgpu
// report` as a workload that holds a whole GPU outside fgpu.
func TestObserveModeSizesPodsFgpuDidNotPlace(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "observe")
	cluster.LabelNamespace(t, ns, api.LabelExtendedResource, "false")
	legacy := devicePluginPod(ns, "legacy", "0:6Gi:40", 1)
	legacy.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	legacy.Spec.Containers[0].Args = append(legacy.Spec.Containers[0].Args, "--gpu", "1")
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.WaitRunning(ctx, ns, "legacy", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	var seen api.ObservedPod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		cm, err := cluster.Client.CoreV1().ConfigMaps(framework.Namespace).Get(ctx, api.ObservedUsagePrefix+cluster.Node, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		var u api.ObservedUsage
		if json.Unmarshal([]byte(cm.Data[api.ObservedUsageKey]), &u) != nil {
			return false, nil
		}
		i := slices.IndexFunc(u.Pods, func(p api.ObservedPod) bool { return p.UID == string(pod.UID) })
		if i < 0 || len(u.Pods[i].GPUs) != 1 || u.Pods[i].GPUs[0].Usage.MemoryMaxBytes < 6<<30 {
			return false, nil
		}
		seen = u.Pods[i]
		return true, nil
	}); err != nil {
		t.Fatalf("the plugin's observed usage never named %s/legacy using 6Gi of a GPU", ns)
	}
	if seen.Namespace != ns || seen.Name != "legacy" || seen.GPUs[0].Device != "gpu-1" {
		t.Errorf("observed %+v; want %s/legacy on gpu-1", seen, ns)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "legacy", "Pod "+ns+"/legacy request gpu: recommended memory", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	kubectlDir := buildKubectlFgpu(t)
	out := kubectlFgpu(t, kubectlDir, "report", "-n", ns)
	if !strings.Contains(out, "+"+ns+"/Pod/legacy") || !strings.Contains(out, "outside fgpu") {
		t.Errorf("report:\n%s\nwant %s/Pod/legacy marked as held outside fgpu", out, ns)
	}
	r := usageReport(t, kubectlDir, ns)
	if i := slices.IndexFunc(r.Workloads, func(w clusterview.WorkloadReport) bool { return w.Name == "legacy" }); i < 0 ||
		r.Workloads[i].Used == nil || r.Workloads[i].Used.MemoryPeakBytes < 6<<30 {
		t.Errorf("report -o json workloads %+v; want legacy with its measured 6Gi", r.Workloads)
	}

	// Measuring it touched nothing: fgpu offers no share of its GPU, and the pod runs as it did.
	waitForeignTaint(t, "gpu-1", "legacy")
	now, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "legacy", metav1.GetOptions{})
	if err != nil || now.UID != pod.UID || now.Status.Phase != corev1.PodRunning || now.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("legacy after being measured: %v; want it running, never restarted", err)
	}
}
