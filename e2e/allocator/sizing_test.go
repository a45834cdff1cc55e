package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

// fakeDevDir is where the chart's plugin keeps its fake device nodes and their usage files.
const fakeDevDir = framework.StateDir + "/fake-dev"

// replayPod is a GPU pod whose fgpu-probe plays a usage pattern on its fake GPU: it needs the
// node's PID namespace (its PID is what the usage file names) and the fake device directory.
func replayPod(ns, name, memory, steps string) *corev1.Pod {
	gp := framework.MakeGPUPod(ns, name)
	if memory != "" {
		gp = gp.Memory(memory)
	}
	p := gp.Pod()
	p.Spec.HostPID = true
	c := &p.Spec.Containers[0]
	c.Args = []string{"--replay-usage", steps, "--usage-dir", fakeDevDir}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "fake-dev", MountPath: fakeDevDir})
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "fake-dev",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fakeDevDir}}})
	return p
}

// sizedDeployment creates a namespace (prefix), a SharingPolicy for it with sizing mode and
// latency class ("" for the default), and a Deployment "web" of one replica, its pods labelled
// app=web, whose claim (from a template) asks memory ("" for a whole GPU) and whose pod
// replays steps; it returns the namespace.
func sizedDeployment(t *testing.T, prefix string, mode api.SizingMode, latency api.LatencyClass, memory, steps string) string {
	t.Helper()
	ctx := context.Background()
	ns := cluster.Namespace(t, prefix)
	if mode != "" {
		cluster.LabelNamespace(t, ns, "fgpu.dev/e2e-sizing", ns)
		pol := builders.MakePolicy("sizing-"+ns).Namespaces("fgpu.dev/e2e-sizing", ns).Sizing(mode)
		if latency != "" {
			pol = pol.Latency(latency)
		}
		createPolicy(t, pol.Obj())
	}
	gp := framework.MakeGPUPod(ns, "web")
	if memory != "" {
		gp = gp.Memory(memory)
	}
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, gp.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := replayPod(ns, "web", memory, steps)
	labels := map[string]string{"app": "web"}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: pod.Spec}},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return ns
}

// A Deployment under sizing Initial replays a usage pattern; the plugin reports it in the
// claim's status and the allocator, after enough samples, recommends a size above the peak
// for the Deployment, readable as an event and through `fgpu recommendations`'s reader; the
// running pod keeps what it asked, and a new pod of the Deployment gets the recommended size.
// (The suite installs the chart with a 1 s poll, 5 s reports and 20 samples before a
// recommendation.)
func TestMeasuredUsageSizesNewPods(t *testing.T) {
	ctx := context.Background()
	ns := sizedDeployment(t, "sizing", api.SizingInitial, "", "20Gi", "0:2Gi:30,3:6Gi:40")
	var running *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil || len(pods.Items) == 0 || pods.Items[0].Status.Phase != corev1.PodRunning {
			return false, nil
		}
		running = &pods.Items[0]
		return true, nil
	}); err != nil {
		t.Fatal("the Deployment's pod did not run")
	}
	claim, err := cluster.ClaimOf(ctx, running)
	if err != nil {
		t.Fatal(err)
	}
	// The measured peak reaches the claim's status.
	var usage api.ShareUsage
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, st := range c.Status.Devices {
			var data api.DeviceStatusData
			if st.Data != nil && json.Unmarshal(st.Data.Raw, &data) == nil && data.Usage != nil && data.Usage.MemoryMaxBytes == 6<<30 {
				usage = *data.Usage
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no usage with a 6Gi peak in claim %s's status within a minute", claim.Name)
	}
	if usage.SMMaxPercent != 40 {
		t.Errorf("usage %+v; want SM 40 at the peak", usage)
	}
	ev, err := cluster.WaitEvent(ctx, ns, claim.Name, "Deployment "+ns+"/web request gpu: recommended memory", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	recs, err := clusterview.Recommendations(ctx, cluster.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Workload.Kind != "Deployment" || recs[0].Workload.Name != "web" ||
		recs[0].Recommendation.MemoryBytes < 6<<30 || recs[0].Recommendation.MemoryBytes > 8<<30 {
		t.Fatalf("recommendations %+v; want Deployment web above its 6Gi peak, below 8Gi", recs)
	}
	// The running pod's claim, placed before enough samples, keeps what it asked for.
	c, _ := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, claim.Name, metav1.GetOptions{})
	if got := c.Status.Allocation.Devices.Results[0].ConsumedCapacity["memory"]; got.String() != "20Gi" {
		t.Errorf("allocation changed to %s", got.String())
	}
	// A new pod of the Deployment gets the recommended size, in its allocation and its caps.
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var second *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, nil
		}
		for i := range pods.Items {
			if p := &pods.Items[i]; p.Name != running.Name && p.Status.Phase == corev1.PodRunning {
				second = p
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal("the second pod did not run")
	}
	claim2, err := cluster.ClaimOf(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	rec := recs[0].Recommendation
	if got := claim2.Status.Allocation.Devices.Results[0].ConsumedCapacity["memory"]; got.Value() != rec.MemoryBytes {
		t.Errorf("new pod's claim got %s; want the recommended %d bytes", got.String(), rec.MemoryBytes)
	}
	report, err := cluster.Probe(ctx, ns, second.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("0=%dM", rec.MemoryBytes>>20); report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != want {
		t.Errorf("new pod's MPS cap %q; want %q", report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], want)
	}
	if _, err := cluster.WaitEvent(ctx, ns, claim2.Name, "(asked 20Gi)", 30*time.Second); err != nil {
		t.Error(err)
	}
}

// What a plain install gives (no sizing value, no policy for the namespace: the chart's
// default policy, whose sizing the CRD defaults to Recommend): the recommendation is told
// and nothing changes: a new pod of the measured Deployment gets what its claim asks.
func TestSizingRecommendChangesNothing(t *testing.T) {
	ctx := context.Background()
	ns := sizedDeployment(t, "sizing-rec", "", "", "20Gi", "0:2Gi:30")
	// running waits for a running pod of the Deployment other than not.
	running := func(not string) *corev1.Pod {
		t.Helper()
		var found *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				return false, nil
			}
			for i := range pods.Items {
				if p := &pods.Items[i]; p.Name != not && p.Status.Phase == corev1.PodRunning {
					found = p
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			t.Fatalf("no running pod of the Deployment: %v", err)
		}
		return found
	}
	first := running("")
	claim, err := cluster.ClaimOf(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := cluster.WaitEvent(ctx, ns, claim.Name, "sizing Recommend: nothing is changed", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	if st := claim.Annotations[api.AnnotationStatus]; !strings.Contains(st, "[SharingPolicy default]") {
		t.Errorf("the claim was not placed under the chart's default policy: %s", st)
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := running(first.Name)
	for _, p := range []*corev1.Pod{first, second} {
		c, err := cluster.ClaimOf(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Status.Allocation.Devices.Results[0].ConsumedCapacity["memory"]; got.String() != "20Gi" {
			t.Errorf("pod %s's claim got %s under sizing Recommend; want the 20Gi it asks", p.Name, got.String())
		}
	}
	report, err := cluster.Probe(ctx, ns, second.Name)
	if err != nil {
		t.Fatal(err)
	}
	if report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != "0=20480M" {
		t.Errorf("new pod's MPS cap %q; want the 20Gi it asks", report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"])
	}
}

// A workload that grows past its MPS cap fails as a CUDA allocation would.
func TestReplayPastTheCapRunsOutOfMemory(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "sizing-oom")
	gp := framework.MakeGPUPod(ns, "grow").Memory("4Gi")
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, gp.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := replayPod(ns, "grow", "4Gi", "0:2Gi:30,2:5Gi:30")
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	if _, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "grow", metav1.GetOptions{})
		if err != nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Terminated == nil {
			return false, nil
		}
		if code := p.Status.ContainerStatuses[0].State.Terminated.ExitCode; code != 2 {
			t.Fatalf("exit status %d; want 2 (out of memory)", code)
		}
		return true, nil
	}); err != nil {
		t.Fatal("the pod did not fail past its cap")
	}
	raw, _ := cluster.Client.CoreV1().Pods(ns).GetLogs("grow", &corev1.PodLogOptions{}).DoRaw(ctx)
	if !strings.Contains(string(raw), "out of memory") {
		t.Errorf("log %q; want out of memory", raw)
	}
}

// A Deployment under sizing Auto: its first pod keeps what it asked (no samples yet); a pod
// added after the recommendation gets the smaller size; when that pod's use grows toward its
// cap it is not evicted while a PodDisruptionBudget forbids it (told on the pod), and once
// the budget allows it, it is evicted and its replacement comes back larger, with no
// simulated out-of-memory on the way.
func TestSizingAutoEvictsAPodNearItsCap(t *testing.T) {
	ctx := context.Background()
	// 2Gi for 90 s (a recommendation of 2.5Gi), then 2450Mi: under a 2.5Gi cap, past 95 % of it.
	ns := sizedDeployment(t, "sizing-auto", api.SizingAuto, "", "20Gi", "0:2Gi:30,90:2450Mi:30")
	// running waits for a running pod of the Deployment other than those in not, and fails
	// the test on any container restart (a simulated out-of-memory).
	running := func(not ...string) *corev1.Pod {
		t.Helper()
		var found *corev1.Pod
		if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
			pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				return false, nil
			}
			for i := range pods.Items {
				p := &pods.Items[i]
				for _, cs := range p.Status.ContainerStatuses {
					if cs.RestartCount > 0 {
						return false, fmt.Errorf("pod %s restarted: %+v", p.Name, cs.LastTerminationState)
					}
				}
				if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil && !slices.Contains(not, p.Name) {
					found = p
					return true, nil
				}
			}
			return false, nil
		}); err != nil {
			t.Fatalf("no new running pod of the Deployment: %v", err)
		}
		return found
	}
	memOf := func(p *corev1.Pod) int64 {
		t.Helper()
		c, err := cluster.ClaimOf(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		q := c.Status.Allocation.Devices.Results[0].ConsumedCapacity["memory"]
		return q.Value()
	}
	first := running()
	if got := memOf(first); got != 20<<30 {
		t.Fatalf("first pod's claim got %d bytes; want the 20Gi it asked (no samples yet)", got)
	}
	claim, err := cluster.ClaimOf(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, claim.Name, "Deployment "+ns+"/web request gpu: recommended memory", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	// Both pods must stay available: the budget forbids evicting either.
	pdb := &policyv1.PodDisruptionBudget{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"},
		Spec: policyv1.PodDisruptionBudgetSpec{MinAvailable: ptr.To(intstr.FromInt32(2)), Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
	if _, err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Create(ctx, pdb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	second := running(first.Name)
	small := memOf(second)
	if small >= 20<<30 || small < 2<<30 {
		t.Fatalf("second pod's claim got %d bytes; want the recommendation, above 2Gi and below 20Gi", small)
	}
	report, err := cluster.Probe(ctx, ns, second.Name)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("0=%dM", small>>20); report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != want {
		t.Errorf("second pod's MPS cap %q; want %q", report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], want)
	}
	ev, err := cluster.WaitEvent(ctx, ns, second.Name, "the eviction was refused", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, second.Name, metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Fatalf("the second pod was evicted against its PodDisruptionBudget (%v)", err)
	}
	if err := cluster.Client.PolicyV1().PodDisruptionBudgets(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	ev, err = cluster.WaitEvent(ctx, ns, second.Name, "evicted by sizing Auto", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	third := running(first.Name, second.Name)
	if got := memOf(third); got <= small {
		t.Errorf("the replacement's claim got %d bytes; want more than the evicted pod's %d", got, small)
	}
}

// Sizing Auto's burst model, best-effort: a Deployment whose pods each hold 25Gi steady and
// ask for a whole GPU. Once its workload is measured, its first pod (placed before) is
// recreated to burst, and new pods burst: each is guaranteed its typical use and capped at
// twice its peak (50Gi), visible in its env and in `kubectl fgpu top`. Four of them share the
// two 80Gi GPUs, two per GPU, the caps on each GPU adding up to more than it has, because
// their measured use together fits it with headroom; a fifth, whose use would not fit next to
// two of them, waits and says why. No pod runs out of memory on the way.
func TestBurstingPodsShareAGPUTheirCapsOvercommit(t *testing.T) {
	ctx := context.Background()
	ns := sizedDeployment(t, "sizing-burst", api.SizingAuto, api.LatencyBestEffort, "", "0:25Gi:15")
	// pods lists the Deployment's pods, failing on any container restart (a simulated
	// out-of-memory).
	pods := func() []corev1.Pod {
		t.Helper()
		list, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range list.Items {
			for _, cs := range p.Status.ContainerStatuses {
				if cs.RestartCount > 0 {
					t.Fatalf("pod %s restarted: %+v", p.Name, cs.LastTerminationState)
				}
			}
		}
		return list.Items
	}
	// bursting waits for n running pods of the Deployment whose claims burst, and returns
	// them with their claims' allocation results and caps.
	type burster struct {
		pod                  corev1.Pod
		device               string
		guaranteed, capBytes int64
	}
	// burstingNow lists the running pods of the Deployment whose claims burst, with their
	// claims' allocation results and caps.
	burstingNow := func() []burster {
		t.Helper()
		var found []burster
		for _, p := range pods() {
			if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
				continue
			}
			c, err := cluster.ClaimOf(ctx, &p)
			if err != nil || c.Status.Allocation == nil {
				continue
			}
			r := c.Status.Allocation.Devices.Results[0]
			cfg, err := api.MergeConfigs(api.DriverName, c.Status.Allocation.Devices.Config, r.Request)
			if err != nil || cfg.Placement == nil || cfg.Placement.MemoryLimit == nil {
				continue
			}
			g := r.ConsumedCapacity["memory"]
			found = append(found, burster{pod: p, device: r.Device, guaranteed: g.Value(), capBytes: cfg.Placement.MemoryLimit.Value()})
		}
		return found
	}
	// bursting waits for n such pods.
	bursting := func(n int) []burster {
		t.Helper()
		var found []burster
		if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 4*time.Minute, true, func(context.Context) (bool, error) {
			found = burstingNow()
			return len(found) == n, nil
		}); err != nil {
			t.Fatalf("%d bursting pods run, want %d: %v", len(found), n, err)
		}
		return found
	}
	var first *corev1.Pod
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		for _, p := range pods() {
			if p.Status.Phase == corev1.PodRunning {
				first = &p
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the first pod does not run: %v", err)
	}
	ev, err := cluster.WaitEvent(ctx, ns, first.Name, "its workload is measured and its pods may burst", 3*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)
	bursting(1)
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 4}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	four := bursting(4)
	perGPU := map[string][]string{}
	for _, b := range four {
		perGPU[b.device] = append(perGPU[b.device], b.pod.Name)
		if b.capBytes != 50<<30 || b.guaranteed < 25<<30 || b.guaranteed >= b.capBytes {
			t.Errorf("pod %s is guaranteed %d bytes and capped at %d; want at least the 25Gi it uses, capped at 50Gi", b.pod.Name, b.guaranteed, b.capBytes)
		}
		report, err := cluster.Probe(ctx, ns, b.pod.Name)
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("0=%dM", b.capBytes>>20); report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] != want {
			t.Errorf("pod %s's MPS cap %q; want the burst cap %q", b.pod.Name, report.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], want)
		}
		if got := report.Env["FGPU_MEMORY_GUARANTEED_BYTES"]; got != fmt.Sprint(b.guaranteed) {
			t.Errorf("pod %s is told it is guaranteed %q bytes; want %d", b.pod.Name, got, b.guaranteed)
		}
		t.Logf("pod %s on %s: guaranteed %s, capped at %s", b.pod.Name, b.device, fmtGiB(b.guaranteed), fmtGiB(b.capBytes))
	}
	if len(perGPU) != 2 || len(perGPU["gpu-0"]) != 2 {
		t.Errorf("bursting pods per GPU: %v; want two on each: their 50Gi caps overcommit it, their 25Gi of use fits it", perGPU)
	}
	// What `kubectl fgpu top` shows: each bursting share against its burst cap, with what it
	// is guaranteed.
	shares, err := clusterview.Top(ctx, cluster.Client, api.DriverName, ns)
	if err != nil {
		t.Fatal(err)
	}
	shown := 0
	for _, s := range shares {
		if s.MemoryGuaranteed > 0 {
			shown++
			if s.MemoryCap != 50<<30 {
				t.Errorf("top shows %s/%s capped at %d bytes; want the 50Gi burst cap", s.Namespace, s.Claim, s.MemoryCap)
			}
		}
	}
	if shown != 4 {
		t.Errorf("top shows %d bursting shares; want 4: %+v", shown, shares)
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 5}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var fifth string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		for _, p := range pods() {
			if !slices.ContainsFunc(four, func(b burster) bool { return b.pod.Name == p.Name }) && p.DeletionTimestamp == nil {
				fifth = p.Name
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatal(err)
	}
	ev, err = cluster.WaitEvent(ctx, ns, fifth, "measured use and the workload's would not fit", 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(ev)

	// Scaled down to one pod on each GPU (the two kept carry a deletion cost, which the
	// ReplicaSet spares), the two would fit on one GPU: Auto empties one of them, and its pod
	// comes back bursting on the other, with no simulated out-of-memory.
	kept := map[string]string{}
	for _, b := range four {
		if slices.Contains(slices.Collect(maps.Values(kept)), b.device) {
			continue
		}
		kept[b.pod.Name] = b.device
		patch := []byte(`{"metadata":{"annotations":{"controller.kubernetes.io/pod-deletion-cost":"100"}}}`)
		if _, err := cluster.Client.CoreV1().Pods(ns).Patch(ctx, b.pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).UpdateScale(ctx, "web", &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "web"}, Spec: autoscalingv1.ScaleSpec{Replicas: 2}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Auto evicts one pod of a workload at a time, a report interval apart (5 s here).
	var moved string
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 7*time.Minute, true, func(context.Context) (bool, error) {
		events, err := cluster.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			if _, ok := kept[e.InvolvedObject.Name]; ok && strings.Contains(e.Message, "sizing Auto empties") {
				moved = e.InvolvedObject.Name
				t.Log(e.Reason + ": " + e.Message)
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("no kept pod %v was moved to empty its GPU: %v", kept, err)
	}
	var two []burster
	if err := wait.PollUntilContextTimeout(ctx, 2*time.Second, 3*time.Minute, true, func(context.Context) (bool, error) {
		two = burstingNow()
		return len(two) == 2 && two[0].device == two[1].device && two[0].pod.Name != moved && two[1].pod.Name != moved, nil
	}); err != nil {
		t.Fatalf("bursting pods %+v; want two on one GPU, %s replaced", two, moved)
	}
	t.Logf("pods %s and %s share %s; %s's GPU was emptied", two[0].pod.Name, two[1].pod.Name, two[0].device, moved)
	pods()
}

func fmtGiB(b int64) string { return fmt.Sprintf("%.1fGi", float64(b)/(1<<30)) }
