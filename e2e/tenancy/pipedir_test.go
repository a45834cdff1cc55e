package tenancy

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// A tenant's pipe directory is mounted read-write into its containers. The tenant replaces
// its daemon's control socket with a symlink to another namespace's (its path is the
// victim's pipe directory, whose key the tenant can compute), then makes the plugin send its
// daemon commands: a new claim with a larger cap (set the defaults) and the deletion of its
// pods (quit). None of it may reach the victim: its daemon keeps its defaults, its PID and
// its pod, and the victim's pod is neither restarted nor evicted. The test writes the
// symlink on the host, which is the directory the tenant's container sees.
func TestPipeDirectorySymlinkCannotReachAnotherDomain(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	victimNS, ns := cluster.Namespace(t, "pipe-victim"), cluster.Namespace(t, "pipe-tenant")
	tenant := cluster.Tenant(t, ns, "attacker")

	if _, err := cluster.Create(ctx, framework.MakeGPUPod(victimNS, "victim").Memory("10Gi").Compute(30)); err != nil {
		t.Fatal(err)
	}
	victim := running(t, victimNS, "victim")
	vPipe := probe(t, victimNS, "victim").Env["CUDA_MPS_PIPE_DIRECTORY"]
	vLog := filepath.Join(filepath.Dir(vPipe), "log")
	before, err := fakecontrol.ReadState(vLog)
	if err != nil {
		t.Fatalf("the victim's daemon state: %v", err)
	}
	st, err := framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	vPIDs := st.Daemons[vPipe]
	vDaemon := daemonPodOf(t, vPipe)

	if _, err := framework.MakeGPUPod(ns, "a1").Memory("10Gi").Compute(10).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	running(t, ns, "a1")
	aPipe := probe(t, ns, "a1").Env["CUDA_MPS_PIPE_DIRECTORY"]
	if aPipe == "" || aPipe == vPipe {
		t.Fatalf("the tenant's pipe directory %q (the victim's %q)", aPipe, vPipe)
	}
	target, err := filepath.Rel(aPipe, filepath.Join(vPipe, "control"))
	if err != nil {
		t.Fatal(err)
	}
	control := filepath.Join(aPipe, "control")
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, control); err != nil {
		t.Fatal(err)
	}

	// A larger cap in the tenant's domain: the plugin sets its daemon's defaults. Then the
	// tenant's pods go: the plugin stops its daemon.
	if _, err := framework.MakeGPUPod(ns, "a2").Memory("40Gi").Compute(60).CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second) // the prepare, and the MPS checks (every 2 s) that follow
	for _, name := range []string{"a1", "a2"} {
		if err := tenant.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(15 * time.Second) // the unprepares and the daemon's stop

	after, err := fakecontrol.ReadState(vLog)
	if err != nil {
		t.Fatalf("the victim's daemon state: %v", err)
	}
	if after.DefaultActiveThreadPercentage != before.DefaultActiveThreadPercentage || !reflect.DeepEqual(after.DefaultPinnedMemLimit, before.DefaultPinnedMemLimit) {
		t.Errorf("the tenant's commands changed the victim's daemon: defaults threads %s, pinned %v, were %s, %v",
			after.DefaultActiveThreadPercentage, after.DefaultPinnedMemLimit, before.DefaultActiveThreadPercentage, before.DefaultPinnedMemLimit)
	}
	st, err = framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(st.Daemons[vPipe], vPIDs) {
		t.Errorf("the victim's daemon PIDs are %v, were %v", st.Daemons[vPipe], vPIDs)
	}
	if now := daemonPodOf(t, vPipe); now.UID != vDaemon.UID || now.Status.Phase != corev1.PodRunning {
		t.Errorf("the victim's MPS daemon pod %s was replaced or stopped (now %s, %s)", vDaemon.Name, now.Name, now.Status.Phase)
	}
	v, err := cluster.Client.CoreV1().Pods(victimNS).Get(ctx, "victim", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the victim's pod: %v", err)
	}
	if v.UID != victim.UID || v.Status.Phase != corev1.PodRunning || v.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("the victim's pod was replaced or restarted: phase %s, restarts %d", v.Status.Phase, v.Status.ContainerStatuses[0].RestartCount)
	}
	if ev := eventsOf(victimNS, "victim"); strings.Contains(ev, "FgpuMPSServerLost") {
		t.Errorf("the victim's pod was told its server was lost:\n%s", ev)
	}
	healthy(t, victimNS, ns)
}

// A tenant can also put a socket of its own that never answers in place of its daemon's
// control socket, then delete its pod: every command the plugin sends that daemon then waits
// its whole timeout, and the pod's unprepare with them. Another namespace's pod, next to its
// namespace's first one on the other GPU, must start all the same, well within the kubelet's
// 45 s for a prepare: only the tenant's own domain waits. (The tenant's GPU is no place for
// it: the server the plugin could not stop still runs there, and a GPU with a process fgpu
// cannot account for is refused until the process exits.)
func TestHangingControlSocketHoldsOnlyItsDomain(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	ns, otherNS := cluster.Namespace(t, "hang-tenant"), cluster.Namespace(t, "hang-other")
	tenant := cluster.Tenant(t, ns, "attacker")
	if _, err := framework.MakeGPUPod(ns, "a").Memory("10Gi").CreateAs(ctx, tenant.Client); err != nil {
		t.Fatal(err)
	}
	running(t, ns, "a")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(otherNS, "first").Memory("60Gi")); err != nil {
		t.Fatal(err)
	}
	tenantGPU, _ := gpuOf(t, running(t, ns, "a"))
	if otherGPU, _ := gpuOf(t, running(t, otherNS, "first")); otherGPU == tenantGPU {
		t.Fatalf("two namespaces on %s", otherGPU)
	}
	control := filepath.Join(probe(t, ns, "a").Env["CUDA_MPS_PIPE_DIRECTORY"], "control")
	if err := os.Remove(control); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", control) // takes connections into its backlog, never answers
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	if err := tenant.Client.CoreV1().Pods(ns).Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the kubelet starts unpreparing the tenant's claim
	start := time.Now()
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(otherNS, "other").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if otherGPU, _ := gpuOf(t, running(t, otherNS, "other")); otherGPU == tenantGPU {
		t.Logf("placed on the tenant's GPU %s, where the server the plugin could not stop runs", otherGPU)
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("another namespace's pod took %s to run while the tenant's control socket did not answer\n%s", took.Round(time.Second), eventsOf(otherNS, "other"))
	} else {
		t.Logf("another namespace's pod ran %s after it was created", took.Round(100*time.Millisecond))
	}
	healthy(t, otherNS)
}

// daemonPodOf is the MPS daemon pod that serves a pipe directory.
func daemonPodOf(t *testing.T, pipe string) corev1.Pod {
	t.Helper()
	pods, err := cluster.DaemonPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		for _, c := range p.Spec.Containers {
			for _, e := range c.Env {
				if e.Name == "CUDA_MPS_PIPE_DIRECTORY" && e.Value == pipe && p.DeletionTimestamp == nil {
					return p
				}
			}
		}
	}
	t.Fatalf("no MPS daemon pod serves %s", pipe)
	return corev1.Pod{}
}
