package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/internal/testing/fakekubelet"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/mps"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

const pluginNS = "fgpu-system"

// newPodEnv is an env whose MPS daemons run as pods, through a fake clientset whose fake
// kubelet runs them as local processes.
func newPodEnv(t testing.TB) (*env, *k8sfake.Clientset, *fakekubelet.Kubelet) {
	e := newEnv(t)
	client := k8sfake.NewClientset(fakekubelet.Node(node))
	k := fakekubelet.New(t, client)
	e.client = client
	e.cfg.MPSPods = MPSPodConfig{Namespace: pluginNS, Image: "fgpu.dev/fgpu:dev", HostPaths: []string{e.cfg.DevRoot}, ShmSize: 8 << 20}
	return e, client, k
}

func daemonPodNames(t testing.TB, client *k8sfake.Clientset) []string {
	t.Helper()
	list, err := client.CoreV1().Pods(pluginNS).List(context.Background(), metav1.ListOptions{LabelSelector: mps.ComponentLabel + "=" + mps.Component})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	return names
}

// daemonPIDs are the stand-in daemons' PIDs by key.
func daemonPIDs(t testing.TB, s *State) map[string]int {
	t.Helper()
	keys, err := s.daemons.mps.DirKeys()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, k := range keys {
		st, err := fakecontrol.ReadState(s.daemons.mps.LogDir(k))
		if err != nil {
			t.Fatal(err)
		}
		out[k] = st.PID
	}
	return out
}

// mountsUnder counts the mounts at or below dir.
func mountsUnder(t testing.TB, dir string) int {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			n++
		}
	}
	return n
}

func TestMPSDaemonPodsOutliveAPluginRestart(t *testing.T) {
	e, client, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	var claims []string
	for _, c := range []struct{ ns, name string }{{"ns-a", "a1"}, {"ns-a", "a2"}, {"ns-b", "b1"}} {
		claim := builders.MakeClaim(c.ns, c.name).Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
		if _, err := s.Prepare(ctx, claim); err != nil {
			t.Fatal(err)
		}
		claims = append(claims, string(claim.UID))
	}
	before := daemonPIDs(t, s)
	if len(before) != 2 || kubelet.Created() != 2 || len(daemonPodNames(t, client)) != 2 {
		t.Fatalf("two domains: daemons %v, %d pods created", before, kubelet.Created())
	}
	if n := mountsUnder(t, e.cfg.MPSRoot); n != 2 {
		t.Errorf("want one shm tmpfs per daemon, have %d mounts", n)
	}

	restarted := e.state()
	if after := daemonPIDs(t, restarted); fmt.Sprint(after) != fmt.Sprint(before) || kubelet.Created() != 2 || len(daemonPodNames(t, client)) != 2 {
		t.Fatalf("a restart touched the daemons: %v -> %v, %d pods created", before, after, kubelet.Created())
	}
	if n := mountsUnder(t, e.cfg.MPSRoot); n != 2 {
		t.Errorf("a restart stacked shm mounts: %d", n)
	}
	// A new claim of a domain is served by its adopted daemon.
	more := builders.MakeClaim("ns-a", "a3").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := restarted.Prepare(ctx, more); err != nil {
		t.Fatal(err)
	}
	claims = append(claims, string(more.UID))
	if kubelet.Created() != 2 {
		t.Errorf("a prepare after the restart started a daemon again: %d pods created", kubelet.Created())
	}

	for _, uid := range claims {
		if err := restarted.Unprepare(ctx, uid); err != nil {
			t.Fatal(err)
		}
	}
	keys, _ := restarted.daemons.mps.Keys(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 0 || len(keys) != 0 || mountsUnder(t, e.cfg.MPSRoot) != 0 {
		t.Errorf("after the last claims: pods %v, daemons %v, %d mounts", pods, keys, mountsUnder(t, e.cfg.MPSRoot))
	}
	if got, _ := os.ReadDir(e.cfg.MPSRoot); len(got) != 0 {
		t.Errorf("MPS directories left: %v", got)
	}
}

func TestRestartRemovesDaemonPodsNoClaimNeeds(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	// The plugin stopped between dropping the entry and stopping the daemon.
	delete(s.cp.Claims, string(claim.UID))
	if err := s.store.Save(s.cp); err != nil {
		t.Fatal(err)
	}
	// And a pod whose directory is already gone.
	orphan := mps.Daemon{GPUUUID: "GPU-gone", Namespace: "ns-x", Domain: "default"}.Key()
	launcher := &mps.PodLauncher{Client: client, Namespace: pluginNS, NodeName: node, Image: "fgpu.dev/fgpu:dev"}
	dir := filepath.Join(e.cfg.MPSRoot, orphan)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := launcher.Start(ctx, mps.DaemonSpec{Key: orphan, Command: []string{standIn, "-f"}, Env: []string{"CUDA_MPS_PIPE_DIRECTORY=" + dir, "CUDA_MPS_LOG_DIRECTORY=" + dir}, Dir: dir, PipeDir: dir}, false); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if len(daemonPodNames(t, client)) != 2 {
		t.Fatal("want two daemon pods before the restart")
	}
	restarted := e.state()
	keys, _ := restarted.daemons.mps.Keys(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 0 || len(keys) != 0 || mountsUnder(t, e.cfg.MPSRoot) != 0 {
		t.Errorf("a restart kept daemons no claim needs: pods %v, daemons %v, %d mounts", pods, keys, mountsUnder(t, e.cfg.MPSRoot))
	}
}

func TestDaemonPodThatDiedIsStartedAgainOnTheNextPrepareWithAnEvent(t *testing.T) {
	e, client, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	first := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, first); err != nil {
		t.Fatal(err)
	}
	before := daemonPIDs(t, s)
	pods := daemonPodNames(t, client)
	kubelet.Kill(pluginNS, pods[0])

	second := builders.MakeClaim("ns-a", "a2").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, second); err != nil {
		t.Fatal(err)
	}
	after := daemonPIDs(t, s)
	if len(after) != 1 || fmt.Sprint(after) == fmt.Sprint(before) || kubelet.Created() != 2 || len(daemonPodNames(t, client)) != 1 {
		t.Fatalf("the dead daemon was not replaced by one: %v -> %v, %d created", before, after, kubelet.Created())
	}
	for k := range after {
		if st, _ := fakecontrol.ReadState(s.daemons.mps.LogDir(k)); st.DefaultPinnedMemLimit["0"] != "20480M" {
			t.Errorf("the new daemon's defaults: %+v", st)
		}
	}
	events, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, ev := range events.Items {
		if ev.Reason == ReasonMPSDaemonRestarted && ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.Kind == "Node" && strings.Contains(ev.Message, "ns-a/default") {
			found = true
		}
	}
	if !found {
		t.Errorf("no %s event on the node: %+v", ReasonMPSDaemonRestarted, events.Items)
	}
}

// TestReadoptionTime prints the time from a plugin's start (NewState: checkpoint, adopting
// every daemon, CDI specs checked) to ready with 100 prepared claims in 10 namespaces on two
// GPUs, 20 daemon pods. The kubelet plugin registration and slice publishing after it are
// not counted.
//
//	go test ./pkg/plugin -run TestReadoptionTime -v
func TestReadoptionTime(t *testing.T) {
	e, _, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	for i := range 100 {
		claim := builders.MakeClaim(fmt.Sprintf("ns-%d", i%10), fmt.Sprintf("c%d", i)).Memory("1Gi").AllocatedOn(node, fmt.Sprintf("gpu-%d", i/10%2)).Obj()
		if _, err := s.Prepare(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	created := kubelet.Created()
	var times []time.Duration
	for range 5 {
		start := time.Now()
		restarted := e.state()
		times = append(times, time.Since(start))
		if len(restarted.cp.Claims) != 100 || kubelet.Created() != created {
			t.Fatalf("restart: %d claims, %d pods created (want %d)", len(restarted.cp.Claims), kubelet.Created(), created)
		}
	}
	for _, e := range s.cp.Claims {
		if e.State != checkpoint.PrepareCompleted {
			t.Fatal("claim not completed")
		}
	}
	t.Logf("plugin start to ready with 100 prepared claims, %d daemon pods adopted: %v", created, times)
}

// budgetOf is daemon key's disruption budget, nil if none.
func budgetOf(t *testing.T, client *k8sfake.Clientset, key string) *policyv1.PodDisruptionBudget {
	t.Helper()
	name := (&mps.PodLauncher{NodeName: node}).PodName(key)
	b, err := client.PolicyV1().PodDisruptionBudgets(pluginNS).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A drain evicts the MPS daemon's pod as readily as its clients' pods, and a client whose
// PodDisruptionBudget refuses its eviction would lose its server all the same: the daemon is
// guarded by a budget of its own while a client that a drain evicts uses it, and not beyond.
// A DaemonSet's pod does not hold it: a drain leaves such pods on the node and would wait for
// the daemon forever.
func TestDaemonIsGuardedWhileAClientADrainEvictsUsesIt(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	const podWeb, podAgent = "11111111-2222-3333-4444-000000000001", "11111111-2222-3333-4444-000000000002"
	web := builders.MakeClaim("ns-a", "web").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, web, []checkpoint.PodRef{{UID: podWeb, Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	key := s.cp.Claims[string(web.UID)].Devices[0].MPSKey
	if budgetOf(t, client, key) == nil {
		t.Fatal("the daemon of a Deployment's pod has no disruption budget")
	}
	agent := builders.MakeClaim("ns-a", "agent").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, agent, []checkpoint.PodRef{{UID: podAgent, Name: "agent", DaemonSet: true}}); err != nil {
		t.Fatal(err)
	}
	if s.cp.Claims[string(agent.UID)].Devices[0].MPSKey != key {
		t.Fatal("the two claims of one namespace use two daemons: nothing to test")
	}
	if err := s.Unprepare(ctx, string(web.UID)); err != nil {
		t.Fatal(err)
	}
	if len(daemonPodNames(t, client)) != 1 {
		t.Fatal("the DaemonSet's pod lost its daemon")
	}
	if budgetOf(t, client, key) != nil {
		t.Error("a daemon only a DaemonSet's pod uses keeps its budget: a drain would wait for it forever")
	}

	// The agent's pod is taken out of its DaemonSet: a drain evicts it now, and the daemon
	// after it.
	if _, err := client.ResourceV1().ResourceClaims("ns-a").Create(ctx, withReservedFor(agent, "agent", podAgent), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	d := &Driver{state: s, client: client, cfg: e.cfg}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "agent", UID: podAgent,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "agent", UID: "ds-uid", Controller: ptr.To(true)}}},
		Spec:   corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("agent")}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	d.podSeen(ctx, pod)
	if budgetOf(t, client, key) != nil {
		t.Fatal("the DaemonSet's pod, seen again, made its daemon guarded")
	}
	pod.OwnerReferences = nil
	d.podSeen(ctx, pod)
	if budgetOf(t, client, key) == nil {
		t.Error("the daemon of a pod no DaemonSet controls any more has no budget")
	}

	if err := s.Unprepare(ctx, string(agent.UID)); err != nil {
		t.Fatal(err)
	}
	if pods := daemonPodNames(t, client); len(pods) != 0 || budgetOf(t, client, key) != nil {
		t.Errorf("after the last client: daemon pods %v, budget %v", pods, budgetOf(t, client, key))
	}
}

// Daemons started by a plugin without budgets (an upgrade), or whose budget was deleted, get
// one when the plugin starts.
func TestRestartGuardsTheDaemonsItAdopts(t *testing.T) {
	e, client, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, claim, []checkpoint.PodRef{{UID: "11111111-2222-3333-4444-000000000001", Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	key := s.cp.Claims[string(claim.UID)].Devices[0].MPSKey
	b := budgetOf(t, client, key)
	if b == nil {
		t.Fatal("no budget")
	}
	if err := client.PolicyV1().PodDisruptionBudgets(pluginNS).Delete(ctx, b.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.state()
	if budgetOf(t, client, key) == nil || kubelet.Created() != 1 {
		t.Errorf("after a restart: budget %v, %d daemon pods created; want the adopted daemon guarded", budgetOf(t, client, key), kubelet.Created())
	}
}

// withReservedFor is claim as the API holds it once reserved for one pod.
func withReservedFor(claim *resourceapi.ResourceClaim, pod, uid string) *resourceapi.ResourceClaim {
	c := claim.DeepCopy()
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: types.UID(uid)}}
	return c
}

// slowGuard is a launcher whose guard of one daemon hangs until release is closed.
type slowGuard struct {
	mps.Launcher
	key     string
	release chan struct{}
}

func (g slowGuard) Protect(ctx context.Context, key string, protect bool) error {
	if key == g.key {
		<-g.release
	}
	inner, ok := g.Launcher.(daemonGuard)
	if !ok {
		return nil
	}
	return inner.Protect(ctx, key, protect)
}

// Review of issue 24: a tenant that changes its pod's controller again and again had the
// plugin read the claim and change its daemon's budget under the state's lock, at client-go's
// default 5 requests a second, so other tenants' prepares on the node waited. A recorded pod's
// change reads nothing from the API, and a budget is changed without the lock: while one
// domain's budget change hangs, another namespace's claim is prepared and guarded.
func TestOneDomainsSlowBudgetHoldsUpNoOtherPrepare(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	const podA = "11111111-2222-3333-4444-00000000000a"
	a := builders.MakeClaim("ns-a", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, a, []checkpoint.PodRef{{UID: podA, Name: "a", DaemonSet: true}}); err != nil {
		t.Fatal(err)
	}
	keyA := s.cp.Claims[string(a.UID)].Devices[0].MPSKey
	release := make(chan struct{})
	s.daemons.mps.Launcher = slowGuard{Launcher: s.daemons.mps.Launcher, key: keyA, release: release}
	var claimReads atomic.Int32
	client.PrependReactor("get", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
		claimReads.Add(1)
		return false, nil, nil
	})
	// The tenant's pod leaves its DaemonSet: its daemon is to be guarded, and that hangs.
	d := &Driver{state: s, client: client, cfg: e.cfg}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns-a", Name: "a", UID: podA},
		Spec:       corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("a")}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	seen := make(chan struct{})
	go func() { d.podSeen(ctx, pod); close(seen) }()
	b := builders.MakeClaim("ns-b", "b").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	prepared := make(chan error, 1)
	go func() {
		_, err := s.PrepareFor(ctx, b, []checkpoint.PodRef{{UID: "11111111-2222-3333-4444-00000000000b", Name: "b"}})
		prepared <- err
	}()
	select {
	case err := <-prepared:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("another namespace's prepare waited for the tenant's hanging budget change")
	}
	s.mu.Lock()
	keyB := s.cp.Claims[string(b.UID)].Devices[0].MPSKey
	s.mu.Unlock()
	if budgetOf(t, client, keyB) == nil {
		t.Error("the other namespace's daemon is not guarded")
	}
	close(release)
	<-seen
	if budgetOf(t, client, keyA) == nil {
		t.Error("the tenant's daemon is not guarded once its pod left the DaemonSet")
	}
	// Back into its DaemonSet while a guard change hangs again: the change waits for no one,
	// and the hanging one, done, reads the last state.
	release = make(chan struct{})
	if slow, ok := s.daemons.mps.Launcher.(slowGuard); ok {
		s.daemons.mps.Launcher = slowGuard{Launcher: slow.Launcher, key: keyA, release: release}
	}
	first := make(chan struct{})
	ds := []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: "a", UID: "ds-uid", Controller: ptr.To(true)}}
	go func() {
		p := pod.DeepCopy()
		p.OwnerReferences = ds
		d.podSeen(ctx, p)
		close(first)
	}()
	time.Sleep(200 * time.Millisecond) // the first change is hanging in its budget update
	again := make(chan struct{})
	go func() {
		p := pod.DeepCopy() // out of the DaemonSet once more
		d.podSeen(ctx, p)
		p.OwnerReferences = ds
		d.podSeen(ctx, p) // and back in
		close(again)
	}()
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("a change of the same daemon's guard waited for the hanging one")
	}
	close(release)
	<-first
	if budgetOf(t, client, keyA) != nil {
		t.Error("the daemon of a DaemonSet's pod is still guarded after the last change")
	}
	if n := claimReads.Load(); n != 0 {
		t.Errorf("a recorded pod's change of controller read the claim %d time(s)", n)
	}
}
