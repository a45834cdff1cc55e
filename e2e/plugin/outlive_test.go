package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// upgradeTag is the fgpu image retagged, so that a helm upgrade changes the plugin's image.
const upgradeTag = "e2e-upgrade"

// servers is what must not change while tenants run: the stand-in daemons (PIDs by pipe
// directory) and their pods (UIDs by name).
type servers struct {
	daemons map[string][]int
	pods    map[string]types.UID
}

func readServers(t *testing.T) servers {
	t.Helper()
	st, err := framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	pods, err := cluster.DaemonPods(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := servers{daemons: st.Daemons, pods: map[string]types.UID{}}
	for name, p := range pods {
		s.pods[name] = p.UID
	}
	return s
}

// MPS servers outlive the plugin: three tenants of three namespaces (three servers) run
// while the plugin's DaemonSet is rolled out and while the chart is upgraded to another
// image; no server and no tenant restarts, new claims are prepared, and once the tenants
// are gone nothing is left: no daemon pod, no shm mount, no directory, no checkpoint entry.
func TestMPSServersOutliveThePlugin(t *testing.T) {
	ctx := context.Background()
	type tenant struct {
		ns, name string
		uid      types.UID
	}
	var tenants []tenant
	for i := range 3 {
		ns := cluster.Namespace(t, fmt.Sprintf("outlive%d", i))
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "tenant").Memory("10Gi")); err != nil {
			t.Fatal(err)
		}
		tenants = append(tenants, tenant{ns: ns, name: "tenant"})
	}
	for i, tn := range tenants {
		pod, err := cluster.WaitRunning(ctx, tn.ns, tn.name, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		tenants[i].uid = pod.UID
	}
	before := readServers(t)
	if len(before.daemons) != 3 || len(before.pods) != 3 {
		t.Fatalf("three namespaces: want three stand-in daemons in three pods, have %v and %v", before.daemons, before.pods)
	}
	for dir, pids := range before.daemons {
		if len(pids) != 1 {
			t.Fatalf("daemon of %s runs %d times: %v", dir, len(pids), pids)
		}
	}
	checkSharedShm(t, tenants[0].ns, tenants[0].name, before)

	untouched := func(step string) {
		t.Helper()
		after := readServers(t)
		if fmt.Sprint(after.daemons) != fmt.Sprint(before.daemons) || fmt.Sprint(after.pods) != fmt.Sprint(before.pods) {
			t.Errorf("%s restarted MPS servers: daemons %v -> %v, pods %v -> %v", step, before.daemons, after.daemons, before.pods, after.pods)
		}
		for _, tn := range tenants {
			p, err := cluster.Client.CoreV1().Pods(tn.ns).Get(ctx, tn.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			restarts := int32(0)
			for _, c := range p.Status.ContainerStatuses {
				restarts += c.RestartCount
			}
			if p.UID != tn.uid || p.Status.Phase != corev1.PodRunning || restarts != 0 {
				t.Errorf("%s: tenant %s/%s: UID %s (was %s), %s, %d restarts", step, tn.ns, tn.name, p.UID, tn.uid, p.Status.Phase, restarts)
			}
		}
	}
	// A new claim of a running domain is prepared on its adopted server.
	newClaim := func(step string, i int) {
		t.Helper()
		tn := tenants[i%len(tenants)]
		name := fmt.Sprintf("after-%d", i)
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(tn.ns, name).Memory("5Gi")); err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.WaitRunning(ctx, tn.ns, name, 2*time.Minute); err != nil {
			t.Fatalf("%s: a new claim was not prepared: %v", step, err)
		}
		first, _ := cluster.Probe(ctx, tn.ns, tn.name)
		r, err := cluster.Probe(ctx, tn.ns, name)
		if err != nil || r.Env["CUDA_MPS_PIPE_DIRECTORY"] != first.Env["CUDA_MPS_PIPE_DIRECTORY"] {
			t.Errorf("%s: the new claim's pipe directory %q is not its domain's %q (%v)", step, r.Env["CUDA_MPS_PIPE_DIRECTORY"], first.Env["CUDA_MPS_PIPE_DIRECTORY"], err)
		}
		deletePod(t, tn.ns, name)
	}

	pluginsBefore, registrations := framework.PluginPIDs(), framework.PluginRegistrations()
	if _, err := framework.Run(ctx, framework.Bin("kubectl"), "-n", framework.Namespace, "rollout", "restart", "daemonset/fgpu-kubelet-plugin"); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.Run(ctx, framework.Bin("kubectl"), "-n", framework.Namespace, "rollout", "status", "daemonset/fgpu-kubelet-plugin", "--timeout=3m"); err != nil {
		t.Fatal(err)
	}
	waitNewPlugin(t, pluginsBefore, registrations)
	untouched("a rollout restart of the plugin")
	newClaim("after the rollout", 0)

	if _, err := framework.Run(ctx, framework.Bin("ctr"), "--address", framework.ContainerdSocket(), "-n", "k8s.io",
		"images", "tag", "--force", framework.Image, imageWithTag(upgradeTag)); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := cluster.Install(ctx, suiteValues...); err != nil {
			t.Errorf("reinstalling the suite's chart: %v", err)
		}
		if _, err := framework.Run(ctx, framework.Bin("ctr"), "--address", framework.ContainerdSocket(), "-n", "k8s.io", "images", "rm", imageWithTag(upgradeTag)); err != nil {
			t.Errorf("removing the retagged image: %v", err)
		}
	}()
	pluginsBefore, registrations = framework.PluginPIDs(), framework.PluginRegistrations()
	if err := cluster.Install(ctx, append(slices.Clone(suiteValues), "image.tag="+upgradeTag)...); err != nil {
		t.Fatal(err)
	}
	waitNewPlugin(t, pluginsBefore, registrations)
	untouched("a helm upgrade to another image")
	newClaim("after the upgrade", 1)

	for _, tn := range tenants {
		deletePod(t, tn.ns, tn.name)
	}
	waitNodeState(t, func(s framework.NodeState) bool {
		return len(s.SpecClaims) == 0 && len(s.Daemons) == 0 && len(s.MPSDirs) == 0 && len(s.Checkpoint.Claims) == 0
	})
	if pods, err := cluster.DaemonPods(ctx); err != nil || len(pods) != 0 {
		t.Errorf("daemon pods left after the tenants: %v (%v)", pods, err)
	}
	st, err := framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	m := slices.DeleteFunc(framework.MountsUnder(filepath.Join(framework.StateDir, "mps")), func(mp string) bool {
		return slices.Contains(st.Spares, filepath.Base(filepath.Dir(mp)))
	})
	if len(m) != 0 {
		t.Errorf("shm mounts left after the tenants (the spare daemons' aside): %v", m)
	}
}

// checkSharedShm: what a client writes in its /dev/shm, its MPS server sees in its own.
func checkSharedShm(t *testing.T, ns, name string, s servers) {
	t.Helper()
	r, err := cluster.Probe(context.Background(), ns, name)
	if err != nil || r.ShmFile == "" {
		t.Fatalf("the probe wrote no file in /dev/shm: %+v (%v)", r, err)
	}
	pids := s.daemons[r.Env["CUDA_MPS_PIPE_DIRECTORY"]]
	if len(pids) != 1 {
		t.Fatalf("no daemon serves %s: %v", r.Env["CUDA_MPS_PIPE_DIRECTORY"], s.daemons)
	}
	// The daemon's own view of its /dev/shm, through its root.
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/root%s", pids[0], r.ShmFile))
	if err != nil || string(raw) != name {
		t.Errorf("the MPS server does not see the client's %s in its /dev/shm: %q (%v)", r.ShmFile, raw, err)
	}
	shmDir := filepath.Join(filepath.Dir(r.Env["CUDA_MPS_PIPE_DIRECTORY"]), "shm")
	if m := framework.MountsUnder(shmDir); len(m) != 1 {
		t.Errorf("the shm directory %s is not a mount of its own on the host: %v", shmDir, m)
	}
}

// waitNewPlugin waits until a plugin process runs that is none of before and the kubelet has
// registered it (registrations counts those before).
func waitNewPlugin(t *testing.T, before []int, registrations int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		now := framework.PluginPIDs()
		if len(now) == 1 && !slices.Contains(before, now[0]) && framework.PluginRegistrations() > registrations {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new plugin process registered: before %v, now %v", before, now)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func imageWithTag(tag string) string {
	repo, _, _ := strings.Cut(framework.Image, ":")
	return repo + ":" + tag
}

// A plugin may run MPS daemon pods on its own node only, and no other pods.
func TestPluginRunsDaemonPodsOnItsOwnNodeOnly(t *testing.T) {
	ctx := context.Background()
	pod := func(node string, component string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "fgpu-e2e-intruder", Namespace: framework.Namespace,
				Labels: map[string]string{"app.kubernetes.io/component": component}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: framework.Image}},
				ServiceAccountName: "fgpu-mps-daemon", AutomountServiceAccountToken: ptr.To(false)},
		}
	}
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	policyInForce(t, func(opts metav1.CreateOptions) error {
		_, err := pluginOn(t, "some-other-node").CoreV1().Pods(framework.Namespace).Create(ctx, pod(cluster.Node, "mps-daemon"), opts)
		return err
	})
	_, err := pluginOn(t, "some-other-node").CoreV1().Pods(framework.Namespace).Create(ctx, pod(cluster.Node, "mps-daemon"), dryRun)
	if err == nil || !strings.Contains(err.Error(), "may only run MPS daemon pods on its own node, not on node "+cluster.Node) {
		t.Errorf("a plugin on another node created a daemon pod on this node: %v", err)
	}
	own := pluginOn(t, cluster.Node)
	if _, err := own.CoreV1().Pods(framework.Namespace).Create(ctx, pod(cluster.Node, "other"), dryRun); err == nil || !strings.Contains(err.Error(), "may only create and delete MPS daemon pods") {
		t.Errorf("a plugin created a pod that is no daemon's: %v", err)
	}
	if _, err := own.CoreV1().Pods(framework.Namespace).Create(ctx, pod(cluster.Node, "mps-daemon"), dryRun); err != nil {
		t.Errorf("a plugin may not create a daemon pod on its own node: %v", err)
	}
	// Nor a daemon pod that would run with another identity (any other service account).
	other := pod(cluster.Node, "mps-daemon")
	other.Spec.ServiceAccountName = "default"
	if _, err := own.CoreV1().Pods(framework.Namespace).Create(ctx, other, dryRun); err == nil || !strings.Contains(err.Error(), "fgpu-mps-daemon service account") {
		t.Errorf("a plugin created a daemon pod running as another service account: %v", err)
	}
	if _, err := own.CoreV1().Pods("default").Create(ctx, pod(cluster.Node, "mps-daemon"), dryRun); err == nil {
		t.Error("a plugin created a pod outside its namespace")
	}
}

// A daemon pod deleted while a tenant uses it is started again by the domain's next prepare,
// with an event on the Node; unprepare of the last claim removes it.
func TestDeletedMPSDaemonIsStartedAgain(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "redaemon")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "first").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "first", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	pods, err := cluster.DaemonPods(ctx)
	if err != nil || len(pods) != 1 {
		t.Fatalf("want one daemon pod: %v (%v)", pods, err)
	}
	var old corev1.Pod
	for _, p := range pods {
		old = p
	}
	if err := cluster.Client.CoreV1().Pods(framework.Namespace).Delete(ctx, old.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "second").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "second", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, metav1.NamespaceDefault, cluster.Node, "for isolation domain "+ns+"/default was not running", time.Minute); err != nil {
		t.Error(err)
	}
	pods, err = cluster.DaemonPods(ctx)
	if err != nil || len(pods) != 1 || pods[old.Name].UID == old.UID {
		t.Errorf("want the daemon's pod created again: %v (%v)", pods, err)
	}
	st := readServers(t)
	if len(st.daemons) != 1 {
		t.Errorf("want one daemon, have %v", st.daemons)
	}
	// first's CUDA processes lost their server with the daemon: it is moved (evicted), and
	// told why; second, started on the new daemon, stays.
	if _, err := cluster.WaitEvent(ctx, ns, "first", "Evicted", time.Minute); err != nil {
		t.Errorf("the pod whose server died was not moved: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "first", metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Error("the pod whose server died is still there")
		deletePod(t, ns, "first")
	}
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, "second", metav1.GetOptions{}); err != nil || p.DeletionTimestamp != nil {
		t.Errorf("the pod on the restarted daemon was moved too: %v", err)
	}
	deletePod(t, ns, "second")
	waitNodeState(t, func(s framework.NodeState) bool {
		return len(s.SpecClaims) == 0 && len(s.Daemons) == 0 && len(s.MPSDirs) == 0 && len(s.Checkpoint.Claims) == 0
	})
	if pods, err := cluster.DaemonPods(ctx); err != nil || len(pods) != 0 {
		t.Errorf("daemon pods left: %v (%v)", pods, err)
	}
}
