package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

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
	keys, err := s.mps.DirKeys()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, k := range keys {
		st, err := fakecontrol.ReadState(s.mps.LogDir(k))
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
	keys, _ := restarted.mps.Keys(ctx)
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
	keys, _ := restarted.mps.Keys(ctx)
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
		if st, _ := fakecontrol.ReadState(s.mps.LogDir(k)); st.DefaultPinnedMemLimit["0"] != "20480M" {
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
