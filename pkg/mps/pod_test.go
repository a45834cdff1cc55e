package mps

import (
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/fakekubelet"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

const testNS, testNode = "fgpu-system", "node-a"

// podManager is a plugin's Manager whose daemons run as pods through client; a second one
// over the same root and client is the plugin after a restart.
func podManager(t *testing.T, root, bin string, client *fake.Clientset) *Manager {
	shm := int64(0)
	if os.Geteuid() == 0 {
		shm = 8 << 20
	}
	return viewed(t, &Manager{Root: root, Binary: bin, ShmSize: shm, StartTimeout: 5 * time.Second,
		Launcher: &PodLauncher{Client: client, Namespace: testNS, NodeName: testNode, Image: "fgpu.dev/fgpu:dev", StopTimeout: 5 * time.Second,
			ServiceAccount: "fgpu-mps-daemon", PriorityClass: "fgpu-mps-daemon"}})
}

func daemonPods(t *testing.T, client *fake.Clientset) []corev1.Pod {
	t.Helper()
	list, err := client.CoreV1().Pods(testNS).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// mounts counts the mounts on dir in this mount namespace.
func mounts(t *testing.T, dir string) int {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == dir {
			n++
		}
	}
	return n
}

func TestPodDaemonIsAdoptedByARestartedPluginAndStopped(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()

	started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30})
	if err != nil || !started {
		t.Fatalf("Ensure = %v, %v; want started", started, err)
	}
	pods := daemonPods(t, client)
	if len(pods) != 1 {
		t.Fatalf("want one daemon pod, have %d", len(pods))
	}
	p := pods[0]
	spec := p.Spec
	c := spec.Containers[0]
	if p.Name != podLauncher(t, m).PodName(key) || p.Labels[api.LabelMPSDaemon] != key || p.Labels[api.LabelMPSGPU] != "GPU-ABC" || p.Labels[api.LabelMPSNode] != testNode ||
		len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "Node" || p.OwnerReferences[0].UID != "uid-node-"+testNode ||
		// kubectl drain evicts it (budget permitting) without --force; the autoscaler
		// keeps a node whose daemon has clients.
		metav1.GetControllerOf(&p) == nil || p.Annotations[SafeToEvictAnnotation] != "true" ||
		spec.NodeName != testNode || !spec.HostPID || !spec.HostIPC || spec.RestartPolicy != corev1.RestartPolicyNever ||
		spec.PriorityClassName != "fgpu-mps-daemon" || spec.ServiceAccountName != "fgpu-mps-daemon" || *spec.AutomountServiceAccountToken || len(spec.Tolerations) != 1 || spec.Tolerations[0].Operator != corev1.TolerationOpExists ||
		c.Image != "fgpu.dev/fgpu:dev" || !slices.Equal(c.Command, []string{bin, "-f"}) || !*c.SecurityContext.Privileged {
		t.Errorf("daemon pod: %+v", p)
	}
	var shmSource string
	for _, vm := range c.VolumeMounts {
		if vm.MountPath == "/dev/shm" {
			for _, v := range spec.Volumes {
				if v.Name == vm.Name {
					shmSource = v.HostPath.Path
				}
			}
		}
	}
	if shmSource != m.ShmDir(key) {
		t.Errorf("the daemon's /dev/shm is %q, want its clients' %q", shmSource, m.ShmDir(key))
	}
	st, err := fakecontrol.ReadState(m.LogDir(key))
	if err != nil || st.VisibleDevices != "GPU-ABC" || st.DefaultPinnedMemLimit["0"] != "10240M" {
		t.Fatalf("daemon state %+v (%v)", st, err)
	}
	if m.ShmSize > 0 && mounts(t, m.ShmDir(key)) != 1 {
		t.Errorf("shm mounted %d times, want once", mounts(t, m.ShmDir(key)))
	}

	// A restarted plugin adopts the pod: no second pod, no second mount, the same daemon.
	restarted := podManager(t, root, bin, client)
	if keys, err := restarted.Keys(ctx); err != nil || !slices.Equal(keys, []string{key}) {
		t.Fatalf("Keys() = %v, %v", keys, err)
	}
	started, err = restarted.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30})
	if err != nil || started {
		t.Fatalf("Ensure after a restart = %v, %v; want the daemon adopted", started, err)
	}
	if st2, _ := fakecontrol.ReadState(m.LogDir(key)); st2.PID != st.PID || kubelet.Created() != 1 {
		t.Errorf("adopting restarted the daemon: PID %d -> %d, %d pods created", st.PID, st2.PID, kubelet.Created())
	}
	if m.ShmSize > 0 && mounts(t, m.ShmDir(key)) != 1 {
		t.Errorf("shm mounted %d times after a restart, want once", mounts(t, m.ShmDir(key)))
	}

	if err := restarted.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if pods := daemonPods(t, client); len(pods) != 0 {
		t.Errorf("pods left after Stop: %d", len(pods))
	}
	if _, err := os.Stat(m.ShmDir(key)); !os.IsNotExist(err) || mounts(t, m.ShmDir(key)) != 0 {
		t.Errorf("after Stop the shm directory is still there (%v) or mounted (%d)", err, mounts(t, m.ShmDir(key)))
	}
	if err := syscallAlive(st.PID); err == nil {
		t.Errorf("daemon %d still runs after Stop", st.PID)
	}
}

func TestPodDaemonThatDiedIsStartedAgain(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil {
		t.Fatal(err)
	}
	st, _ := fakecontrol.ReadState(m.LogDir(key))
	kubelet.Kill(testNS, podLauncher(t, m).PodName(key))
	if m.Running(ctx, key) {
		t.Fatal("the killed daemon still answers")
	}
	started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30})
	if err != nil || !started {
		t.Fatalf("Ensure after the daemon died = %v, %v; want it started again", started, err)
	}
	st2, _ := fakecontrol.ReadState(m.LogDir(key))
	if st2.PID == st.PID || st2.DefaultPinnedMemLimit["0"] != "10240M" || kubelet.Created() != 2 || len(daemonPods(t, client)) != 1 {
		t.Errorf("after a restart: PID %d -> %d, defaults %v, %d created, %d pods", st.PID, st2.PID, st2.DefaultPinnedMemLimit, kubelet.Created(), len(daemonPods(t, client)))
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
}

func TestPodDaemonThatNeverAnswersSaysWhy(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	kubelet.NoStart = "ErrImageNeverPull"
	m := podManager(t, root, bin, client)
	m.StartTimeout = 500 * time.Millisecond
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	_, err := m.Ensure(ctx, key, "GPU-ABC", Limits{})
	if err == nil || !strings.Contains(err.Error(), "did not answer within 500ms") || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Fatalf("Ensure = %v, want a timeout naming the pod's reason", err)
	}
	// The kubelet's retry finds the pod still starting: it waits for it, never starts another.
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{}); err == nil || kubelet.Created() != 1 {
		t.Fatalf("a second Ensure of a starting daemon: %v, %d pods created", err, kubelet.Created())
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if keys, _ := m.Keys(ctx); len(keys) != 0 || len(daemonPods(t, client)) != 0 {
		t.Errorf("after Stop: keys %v, %d pods", keys, len(daemonPods(t, client)))
	}
}

func syscallAlive(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Signal(syscall.Signal(0))
}

// podLauncher is m's pod launcher.
func podLauncher(t *testing.T, m *Manager) *PodLauncher {
	t.Helper()
	l, ok := m.Launcher.(*PodLauncher)
	if !ok {
		t.Fatalf("the manager's launcher is a %T", m.Launcher)
	}
	return l
}

// PodLauncher caches the Node's UID for the plugin's lifetime. A Node object deleted and
// registered again under the same name (a new UID) leaves every daemon pod created afterwards
// owned by a Node that no longer exists: the garbage collector deletes each such pod right
// after its creation, and the domain's daemon dies again and again until the plugin restarts.
func TestDaemonPodOwnedByTheCurrentNode(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset(fakekubelet.Node(testNode))
	l := &PodLauncher{Client: client, Namespace: testNS, NodeName: testNode, Image: "fgpu.dev/fgpu:dev"}
	start := func(key string) {
		t.Helper()
		dir := shortDir(t)
		if _, err := l.Start(ctx, DaemonSpec{Key: key, Command: []string{"true"}, Dir: dir, PipeDir: dir, ShmDir: dir}, false); err != nil {
			t.Fatal(err)
		}
	}
	start(Daemon{GPUUUID: "GPU-A", Namespace: "ns-a", Domain: "default"}.Key())
	if err := client.CoreV1().Nodes().Delete(ctx, testNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "uid-registered-again"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := Daemon{GPUUUID: "GPU-A", Namespace: "ns-b", Domain: "default"}.Key()
	start(key)
	p, err := client.CoreV1().Pods(testNS).Get(ctx, l.PodName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := p.OwnerReferences[0].UID; got != "uid-registered-again" {
		t.Errorf("daemon pod owned by Node UID %s, which no longer exists (the Node's is uid-registered-again)", got)
	}
}

// A tenant can wedge its own daemon (its pipe directory is mounted read-write): a pod that
// runs without answering is replaced, but no more often than replaceEvery.
func TestPodDaemonThatRunsWithoutAnsweringIsReplacedAtMostEvery30s(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	m.StartTimeout = 500 * time.Millisecond
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	wedge := func() {
		t.Helper()
		if err := os.Remove(m.PipeDir(key) + "/control"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil {
		t.Fatal(err)
	}
	wedge()
	started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30})
	if err != nil || !started || kubelet.Created() != 2 {
		t.Fatalf("Ensure of a running daemon that does not answer = %v, %v, %d pods created; want it replaced", started, err, kubelet.Created())
	}
	if st, _ := fakecontrol.ReadState(m.LogDir(key)); st.DefaultPinnedMemLimit["0"] != "10240M" {
		t.Errorf("the replacement's defaults: %v", st.DefaultPinnedMemLimit)
	}
	wedge()
	started, err = m.Ensure(ctx, key, "GPU-ABC", Limits{})
	if err == nil || started || !strings.Contains(err.Error(), "not replaced again") || kubelet.Created() != 2 {
		t.Fatalf("a second replacement within 30s: %v, %v, %d pods created", started, err, kubelet.Created())
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// A daemon whose pod is being deleted still answers within its grace period; a new claim
// must not become its client, or it loses its server moments later with the others.
func TestPodDaemonOnItsWayOutIsNotJoined(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil {
		t.Fatal(err)
	}
	st, _ := fakecontrol.ReadState(m.LogDir(key))
	name := podLauncher(t, m).PodName(key)
	pod, err := client.CoreV1().Pods(testNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	pod.DeletionTimestamp = &now
	if _, err := client.CoreV1().Pods(testNS).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if !m.Running(ctx, key) {
		t.Fatal("the daemon stopped answering as soon as its pod was marked for deletion: nothing to test")
	}
	started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30})
	if err != nil || !started {
		t.Fatalf("Ensure while the daemon's pod is deleted = %v, %v; want a new daemon", started, err)
	}
	st2, _ := fakecontrol.ReadState(m.LogDir(key))
	if st2.PID == st.PID || st2.DefaultPinnedMemLimit["0"] != "10240M" || kubelet.Created() != 2 || len(daemonPods(t, client)) != 1 {
		t.Errorf("after the replacement: PID %d -> %d, defaults %v, %d created, %d pods", st.PID, st2.PID, st2.DefaultPinnedMemLimit, kubelet.Created(), len(daemonPods(t, client)))
	}
	if started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil || started {
		t.Errorf("Ensure of the new, healthy daemon = %v, %v; want it adopted as it is", started, err)
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// When the API server does not answer, a daemon that answers keeps serving new claims, as it
// did before the plugin also asked about its pod.
func TestAnsweringDaemonServesWhenTheAPIServerDoesNot(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil {
		t.Fatal(err)
	}
	client.PrependReactor("get", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("the server is currently unable to handle the request")
	})
	if started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{PinnedMemBytes: 10 << 30}); err != nil || started {
		t.Errorf("Ensure of an answering daemon with the API server down = %v, %v; want it used as it is", started, err)
	}
	if kubelet.Created() != 1 {
		t.Errorf("%d daemon pods created, want 1", kubelet.Created())
	}
}

// fullNode is a Node whose allocatable CPU and memory a tenant's pod requests in full.
func fullNode(pods int64) (*corev1.Node, *corev1.Pod) {
	node := fakekubelet.Node(testNode)
	node.Status.Allocatable = corev1.ResourceList{
		corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: *resource.NewQuantity(pods, resource.DecimalSI),
	}
	tenant := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-t", Name: "filler"},
		Spec: corev1.PodSpec{NodeName: testNode, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	return node, tenant
}

// The kubelet admits a pod bound to its node only if its requests fit what the node's pods
// left: a tenant that fills the node's requests must not keep another domain's daemon, and
// with it that domain's pods, from starting.
func TestPodDaemonStartsOnANodeWhoseRequestsATenantFilled(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fullNode(110))
	fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	m.StartTimeout = time.Second
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{}); err != nil {
		t.Fatalf("a daemon on a node whose requests a tenant filled: %v", err)
	}
	p, err := client.CoreV1().Pods(testNS).Get(ctx, podLauncher(t, m).PodName(key), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Spec.Containers[0].Resources; len(r.Requests) != 0 || len(r.Limits) != 0 {
		t.Errorf("the daemon pod has requests %v and limits %v; want none", r.Requests, r.Limits)
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
}

// A daemon pod the kubelet refuses all the same (the node runs as many pods as it may) fails
// the prepare with the kubelet's reason: the tenant's pod shows it in its
// FailedPrepareDynamicResources event, instead of waiting in ContainerCreating for no reason
// it can read.
func TestPodDaemonTheKubeletRefusesSaysWhy(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fullNode(1))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	m.StartTimeout = 500 * time.Millisecond
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	_, err := m.Ensure(ctx, key, "GPU-ABC", Limits{})
	if err == nil || !strings.Contains(err.Error(), "OutOfpods: Pod was rejected: Node didn't have enough resource: pods") {
		t.Fatalf("Ensure = %v; want the kubelet's refusal in the error", err)
	}
	// The retry replaces the refused pod.
	if _, err := m.Ensure(ctx, key, "GPU-ABC", Limits{}); err == nil || kubelet.Created() != 2 {
		t.Errorf("the retry: %v, %d pods created; want the refused pod replaced, and refused again", err, kubelet.Created())
	}
}

// A drain evicts pods through the Eviction API, which refuses an eviction a
// PodDisruptionBudget forbids: a protected daemon's budget selects its pod, and only it, keeps
// it (minAvailable 1, an integer: the pod has no controller), survives the pod's replacement
// and goes with the daemon.
func TestPodDaemonBudget(t *testing.T) {
	ctx := context.Background()
	root, bin := shortDir(t), buildStandIn(t)
	client := fake.NewClientset(fakekubelet.Node(testNode))
	kubelet := fakekubelet.New(t, client)
	m := podManager(t, root, bin, client)
	l := podLauncher(t, m)
	key := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-a", Domain: "default"}.Key()
	other := Daemon{GPUUUID: "GPU-ABC", Namespace: "ns-b", Domain: "default"}.Key()
	for _, k := range []string{key, other} {
		if _, err := m.Ensure(ctx, k, "GPU-ABC", Limits{}); err != nil {
			t.Fatal(err)
		}
	}
	budgets := client.PolicyV1().PodDisruptionBudgets(testNS)
	budget := func() *policyv1.PodDisruptionBudget {
		t.Helper()
		b, err := budgets.Get(ctx, l.PodName(key), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if budget() != nil {
		t.Fatal("a daemon got a disruption budget before the plugin protected it")
	}
	for range 2 {
		if err := l.Protect(ctx, key, true); err != nil {
			t.Fatal(err)
		}
	}
	b := budget()
	if b == nil || b.Spec.MinAvailable == nil || *b.Spec.MinAvailable != intstr.FromInt32(1) || b.Spec.MaxUnavailable != nil ||
		len(b.OwnerReferences) != 1 || b.OwnerReferences[0].Kind != "Node" || b.OwnerReferences[0].UID != "uid-node-"+testNode {
		t.Fatalf("budget %+v", b)
	}
	selector, err := metav1.LabelSelectorAsSelector(b.Spec.Selector)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range daemonPods(t, client) {
		if selector.Matches(labels.Set(p.Labels)) != (p.Name == l.PodName(key)) {
			t.Errorf("the budget's selector %s and pod %s (labels %v) disagree", selector, p.Name, p.Labels)
		}
	}
	// The same daemon on another node is not this node's to protect.
	elsewhere := (&PodLauncher{NodeName: "node-b"}).selector(key)
	if selector.Matches(labels.Set(elsewhere)) {
		t.Errorf("the budget's selector %s picks the daemon of another node (%v)", selector, elsewhere)
	}

	// A replaced pod (its daemon died) keeps its budget.
	kubelet.Kill(testNS, l.PodName(key))
	if started, err := m.Ensure(ctx, key, "GPU-ABC", Limits{}); err != nil || !started {
		t.Fatalf("Ensure of a dead daemon = %v, %v", started, err)
	}
	if budget() == nil {
		t.Error("the replaced daemon pod lost its budget")
	}
	if err := l.Protect(ctx, key, false); err != nil || budget() != nil {
		t.Errorf("unprotected: %v, budget %v", err, budget())
	}
	if err := l.Protect(ctx, key, true); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(ctx, key); err != nil {
		t.Fatal(err)
	}
	if budget() != nil {
		t.Error("a stopped daemon left its budget")
	}
	if err := m.Stop(ctx, other); err != nil {
		t.Fatal(err)
	}
}
