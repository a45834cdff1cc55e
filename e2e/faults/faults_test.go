package faults

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

var devDir = filepath.Join(framework.StateDir, "fake-dev")

func inject(t *testing.T, index int, fault string) time.Time {
	t.Helper()
	if err := fake.InjectFault(devDir, index, fault); err != nil {
		t.Fatal(err)
	}
	return time.Now()
}

func recoverGPU(t *testing.T, index int) {
	t.Helper()
	if err := fake.RemoveFaults(devDir, index); err != nil {
		t.Fatal(err)
	}
}

// deviceTaints returns a device's taints as key=value:effect, leaving out the fence.
func deviceTaints(ctx context.Context, device string) []string {
	slices_, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + framework.Driver})
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range slices_.Items {
		for _, d := range s.Spec.Devices {
			if d.Name != device {
				continue
			}
			for _, t := range d.Taints {
				if t.Key != api.FenceTaintKey {
					out = append(out, t.Key+"="+t.Value+":"+string(t.Effect))
				}
			}
		}
	}
	return out
}

func waitTaints(t *testing.T, device string, within time.Duration, want ...string) time.Duration {
	t.Helper()
	start := time.Now()
	var got []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		got = deviceTaints(ctx, device)
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("%s's taints are %v after %s, want %v", device, got, within, want)
	}
	return time.Since(start)
}

// deployment runs n replicas of fgpu-probe, each with a 10Gi share; the claim tolerates a
// fault for tolerate seconds so that the pods' status can show the unhealthy device first.
func deployment(t *testing.T, ns, name string, n int32, tolerate int64) {
	t.Helper()
	ctx := context.Background()
	p := framework.MakeGPUPod(ns, name).Memory("10Gi").Label("app", name)
	tmpl := p.Template()
	tmpl.Spec.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{
		Key: api.FaultTaintKey, Operator: resourceapi.DeviceTolerationOpExists,
		Effect: resourceapi.DeviceTaintEffectNoExecute, TolerationSeconds: ptr.To(tolerate)}}
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := p.Pod()
	d := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: appsv1.DeploymentSpec{
			Replicas: ptr.To(n),
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}}, Spec: pod.Spec},
		},
	}
	if _, err := cluster.Client.AppsV1().Deployments(ns).Create(ctx, d, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// placement is the device of each running pod of the app, by pod name.
func placement(ctx context.Context, t *testing.T, ns, app string) map[string]string {
	t.Helper()
	pods, err := cluster.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		// The caller's poll ran out (its context) or the API server was busy: nothing seen.
		t.Logf("listing the pods of %s: %v", app, err)
		return nil
	}
	out := map[string]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Status.Phase != corev1.PodRunning || p.DeletionTimestamp != nil {
			continue
		}
		c, err := cluster.ClaimOf(ctx, p)
		if err != nil || c.Status.Allocation == nil {
			continue
		}
		out[p.Name] = c.Status.Allocation.Devices.Results[0].Device
	}
	return out
}

func waitPlaced(t *testing.T, ns, app string, n int, within time.Duration, devices ...string) map[string]string {
	t.Helper()
	var got map[string]string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
		got = placement(ctx, t, ns, app)
		if len(got) != n {
			return false, nil
		}
		for _, d := range got {
			if !slices.Contains(devices, d) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("running pods of %s: %v after %s, want %d on %v", app, got, within, n, devices)
	}
	return got
}

// unhealthySeen reports whether a pod's status showed its device unhealthy.
func unhealthySeen(p *corev1.Pod) bool {
	for _, cs := range p.Status.ContainerStatuses {
		for _, rs := range cs.AllocatedResourcesStatus {
			for _, r := range rs.Resources {
				if r.Health == corev1.ResourceHealthStatusUnhealthy {
					return true
				}
			}
		}
	}
	return false
}

// The whole path, in order: a non-fatal fault fences gpu-1 (NoSchedule) so that
// three replicas share gpu-0; a fatal fault on gpu-0 taints it NoExecute within 5 s, the
// pods show the unhealthy device, are evicted and replaced on gpu-1 within 30 s; clearing
// the fault lifts the taint without a plugin restart; a restart keeps an active fault's
// taint and drops a cleared one's; repeated faults keep a GPU fenced for the back-off
// until an admin clears it.
func TestFaultsEndToEnd(t *testing.T) {
	ctx := context.Background()
	t.Cleanup(func() { recoverGPU(t, 0); recoverGPU(t, 1) })
	ns := cluster.Namespace(t, "faults")

	// Non-fatal: NoSchedule only; new pods go elsewhere.
	inject(t, 1, "thermal")
	waitTaints(t, "gpu-1", slowdownWait, api.DegradedTaintKey+"=thermal:NoSchedule")
	deployment(t, ns, "app", 3, 5)
	before := waitPlaced(t, ns, "app", 3, time.Minute, "gpu-0")
	recoverGPU(t, 1)
	waitTaints(t, "gpu-1", slowdownWait)

	// Fatal: NoExecute within 5 s, unhealthy in the pods' status, evicted, replaced.
	injected := inject(t, 0, "xid 79")
	toTaint := waitTaints(t, "gpu-0", 5*time.Second, api.FaultTaintKey+"=xid-79:NoExecute")
	seen := false
	var toEvicted time.Duration
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		gone := 0
		for name := range before {
			p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				gone++
				continue
			}
			seen = seen || unhealthySeen(p)
		}
		return gone == len(before), nil
	})
	if err != nil {
		t.Fatal("the pods on the faulty GPU were not evicted within 30 s")
	}
	toEvicted = time.Since(injected)
	if !seen {
		t.Error("no pod's status showed the unhealthy device before the eviction")
	}
	after := waitPlaced(t, ns, "app", 3, 30*time.Second, "gpu-1")
	t.Logf("fault → taint %s, → evicted %s, → replacements running %s", toTaint, toEvicted, time.Since(injected))
	for name := range after {
		if _, ok := before[name]; ok {
			t.Errorf("pod %s survived the fatal fault", name)
		}
	}

	// Clear: the taint goes without a restart.
	recoverGPU(t, 0)
	waitTaints(t, "gpu-0", 5*time.Second)

	// A restart keeps an active fault's taint (and is no new onset), and drops it once the
	// fault cleared.
	inject(t, 0, "power")
	waitTaints(t, "gpu-0", slowdownWait, api.DegradedTaintKey+"=power:NoSchedule")
	restartPlugin(t)
	waitTaints(t, "gpu-0", 5*time.Second, api.DegradedTaintKey+"=power:NoSchedule")
	recoverGPU(t, 0)
	restartPlugin(t)
	waitTaints(t, "gpu-0", 30*time.Second)

	// Flapping: the third fault within the window keeps gpu-0 fenced after it clears,
	// until an admin clears it. (Its first two faults were the xid and power above; the
	// restarts were none.)
	inject(t, 0, "thermal")
	waitTaints(t, "gpu-0", slowdownWait, api.DegradedTaintKey+"=thermal:NoSchedule", api.FlappingTaintKey+"=backoff:NoSchedule")
	recoverGPU(t, 0)
	waitTaints(t, "gpu-0", slowdownWait, api.FlappingTaintKey+"=backoff:NoSchedule")
	time.Sleep(5 * time.Second)
	if got := deviceTaints(ctx, "gpu-0"); !slices.Equal(got, []string{api.FlappingTaintKey + "=backoff:NoSchedule"}) {
		t.Fatalf("the back-off did not hold: %v", got)
	}
	if out, err := framework.Run(ctx, fgpuBin, "faults", "clear", "gpu-0"); err != nil {
		t.Fatalf("fgpu faults clear: %v: %s", err, out)
	}
	waitTaints(t, "gpu-0", 5*time.Second)
}

// slowdownWait bounds the wait for a thermal or power slowdown's taint to come or go: the
// plugin damps them over three polls (2 s each).
const slowdownWait = 15 * time.Second

// restartPlugin kills the plugin and waits for the kubelet to start it again.
func restartPlugin(t *testing.T) {
	t.Helper()
	old := framework.PluginPIDs()
	if _, err := framework.KillPlugin(); err != nil {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		now := framework.PluginPIDs()
		return len(now) > 0 && !slices.ContainsFunc(now, func(p int) bool { return slices.Contains(old, p) }), nil
	})
	if err != nil {
		t.Fatal("the plugin did not come back")
	}
}
