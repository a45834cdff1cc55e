package plugin

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// A domain's first claim on a GPU takes the spare daemon started ahead there: no daemon pod
// is created for it, the domain's next claim joins the same daemon, and another spare is
// started behind it. Unprepares stop the domain's daemon, never a spare.
func TestFirstClaimOfADomainTakesTheGPUsSpareDaemon(t *testing.T) {
	e, client, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	if !s.spares.enabled() {
		t.Fatal("daemons run in pods, but spares are off")
	}
	s.spares.fill(ctx)
	spares := map[string]string{}
	for uuid, key := range s.spares.byGPU {
		spares[uuid] = key
	}
	if len(spares) != 2 || kubelet.Created() != 2 || len(daemonPodNames(t, client)) != 2 {
		t.Fatalf("want a spare on each of the 2 GPUs: %v, %d pods created", spares, kubelet.Created())
	}
	for _, key := range spares {
		if !strings.HasPrefix(key, mps.SparePrefix) || !s.daemons.mps.Running(ctx, key) {
			t.Errorf("spare %s: not a spare's key, or not answering", key)
		}
		// As a real control daemon with no client: no server process on the GPU.
		if pids, err := s.daemons.mps.ServerPIDs(ctx, key); err != nil || len(pids) != 0 {
			t.Errorf("spare %s runs servers %v (%v)", key, pids, err)
		}
	}
	if changes := s.RefreshForeign(ctx); len(changes) != 0 {
		t.Errorf("the spares made GPUs foreign-busy: %v", changes)
	}

	gpu0 := s.devices["gpu-0"].UUID
	first := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	second := builders.MakeClaim("ns-a", "a2").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, first); err != nil {
		t.Fatal(err)
	}
	if got := s.cp.Claims[string(first.UID)].Devices[0].MPSKey; got != spares[gpu0] {
		t.Fatalf("the domain's first claim got daemon %s; want gpu-0's spare %s", got, spares[gpu0])
	}
	if kubelet.Created() != 2 {
		t.Errorf("the first claim waited for a daemon pod of its own: %d pods created", kubelet.Created())
	}
	if _, err := s.Prepare(ctx, second); err != nil {
		t.Fatal(err)
	}
	if got := s.cp.Claims[string(second.UID)].Devices[0].MPSKey; got != spares[gpu0] {
		t.Errorf("the domain's second claim got daemon %s; want its domain's %s", got, spares[gpu0])
	}
	// Another domain on the same GPU: no spare is ready until the loop starts one.
	other := builders.MakeClaim("ns-b", "b1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, other); err != nil {
		t.Fatal(err)
	}
	if got := s.cp.Claims[string(other.UID)].Devices[0].MPSKey; got == spares[gpu0] || strings.HasPrefix(got, mps.SparePrefix) {
		t.Errorf("another domain got daemon %s, the first domain's or a spare that was not ready", got)
	}
	s.spares.fill(ctx)
	if k := s.spares.byGPU[gpu0]; k == "" || k == spares[gpu0] || !s.spares.ready[k] {
		t.Errorf("no new spare on gpu-0 behind the one taken: %q", k)
	}

	for _, claim := range []string{string(first.UID), string(second.UID), string(other.UID)} {
		if err := s.Unprepare(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	keys, err := s.daemons.mps.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || !s.spares.has(keys[0]) || !s.spares.has(keys[1]) {
		t.Errorf("after the last claims, daemons %v; want only the two spares %v", keys, s.spares.byGPU)
	}
	if s.daemons.mps.Running(ctx, spares[gpu0]) {
		t.Errorf("the daemon the domain took from the spares still runs after its last claim")
	}
}

// A restarted plugin stops the spares of the one before it, which no claim took, and starts
// its own.
func TestRestartStopsTheSparesNoClaimTook(t *testing.T) {
	e, client, _ := newPodEnv(t)
	ctx := context.Background()
	s := e.state()
	s.spares.fill(ctx)
	old := map[string]bool{}
	for _, k := range s.spares.byGPU {
		old[k] = true
	}
	restarted := e.state()
	if keys, _ := restarted.daemons.mps.Keys(ctx); len(keys) != 0 || len(daemonPodNames(t, client)) != 0 {
		t.Fatalf("the restart kept the spares no claim took: %v", keys)
	}
	restarted.spares.fill(ctx)
	for _, k := range restarted.spares.byGPU {
		if old[k] {
			t.Errorf("spare %s reused after a restart", k)
		}
	}
}

// A plugin that stops (an upgrade, an uninstall) stops the spares no claim took; the daemons
// of claims stay, as they outlive the plugin.
func TestStoppingPluginStopsItsSparesOnly(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx, cancel := context.WithCancel(context.Background())
	go s.spares.run(ctx)
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		s.mu.Lock()
		ready := len(s.spares.ready)
		s.mu.Unlock()
		if ready == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no spares started")
		}
	}
	if _, err := s.Prepare(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	domain := s.cp.Claims[string(claim.UID)].Devices[0].MPSKey
	cancel()
	s.spares.stop(context.Background())
	keys, err := s.daemons.mps.Keys(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != domain || len(daemonPodNames(t, client)) != 1 {
		t.Errorf("after the stop: daemons %v, pods %v; want only the domain's %s", keys, daemonPodNames(t, client), domain)
	}
}

// A corrupt checkpoint is rebuilt onto the daemon each claim's containers were given: a
// domain whose first claim took a spare keeps that daemon, with its clients, and its next
// claim joins it, rather than a daemon under the key the planner derives.
func TestRebuiltCheckpointKeepsTheSpareADomainTook(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	s.spares.fill(ctx)
	gpu0 := s.devices["gpu-0"].UUID
	spare := s.spares.byGPU[gpu0]
	a := reserved(builders.MakeClaim("ns", "a").Memory("10Gi").Created(1).AllocatedOn(node, "gpu-0").Obj())
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := s.cp.Claims[string(a.UID)].Devices[0].MPSKey; got != spare {
		t.Fatalf("the domain's first claim got daemon %s; want the spare %s", got, spare)
	}
	pid := daemonPIDs(t, s)[spare]
	b := reserved(builders.MakeClaim("ns", "b").Memory("10Gi").Created(2).AllocatedOn(node, "gpu-0").Obj())
	if err := client.Tracker().Add(a); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfg.CheckpointPath(), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	restarted := e.state()
	if got := restarted.cp.Claims[string(a.UID)]; got == nil || got.Devices[0].MPSKey != spare {
		t.Fatalf("rebuilt claim a: %+v; want it on the spare it took, %s", got, spare)
	}
	if got := daemonPIDs(t, restarted)[spare]; got != pid || !restarted.daemons.mps.Running(ctx, spare) {
		t.Errorf("the domain's daemon was replaced or stopped by the rebuild: PID %d, was %d", got, pid)
	}
	if _, err := restarted.Prepare(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := restarted.cp.Claims[string(b.UID)].Devices[0].MPSKey; got != spare {
		t.Errorf("the domain's next claim got daemon %s; want its domain's %s", got, spare)
	}
}

// A spare carries the mark that no domain took it, and its pod does not keep the cluster
// autoscaler from removing an idle node; a daemon a domain took is marked no more.
func TestSpareIsMarkedUntilTaken(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	s.spares.fill(ctx)
	gpu0 := s.devices["gpu-0"].UUID
	spare := s.spares.byGPU[gpu0]
	marker := filepath.Join(s.daemons.mps.Root, spare, mps.SpareMarker)
	if b, err := os.ReadFile(marker); err != nil || string(b) != mps.SpareReady {
		t.Fatalf("spare %s's mark: %q (%v); want it ready", spare, b, err)
	}
	pods, err := client.CoreV1().Pods(pluginNS).List(ctx, metav1.ListOptions{LabelSelector: configapi.LabelMPSDaemon + "=" + spare})
	if err != nil || len(pods.Items) != 1 {
		t.Fatalf("spare %s's pods: %v (%v)", spare, pods, err)
	}
	if got := pods.Items[0].Annotations[mps.SafeToEvictAnnotation]; got != "true" {
		t.Errorf("spare pod's %s = %q; want true: it has no client", mps.SafeToEvictAnnotation, got)
	}
	claim := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("the daemon a domain took is still marked a spare (%v)", err)
	}
}

// A cordoned node gets no spares and stops those it has: a drain would evict them, and no
// new pod is scheduled there. Uncordoned, it gets them again.
func TestCordonedNodeStopsItsSpares(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := s.spares.watchNode(ctx, client); err != nil {
		t.Fatal(err)
	}
	s.spares.fill(ctx)
	if len(daemonPodNames(t, client)) != 2 {
		t.Fatalf("want a spare on each GPU: %v", daemonPodNames(t, client))
	}
	// seen waits for the watch to show the node's cordon as on.
	seen := func(on bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); s.spares.cordoned() != on; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the node watch never saw cordoned=%v", on)
			}
		}
	}
	cordon := func(on bool) {
		t.Helper()
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Spec.Unschedulable = on
		if _, err := client.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cordon(true)
	seen(true)
	s.spares.fill(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 0 || len(s.spares.byGPU) != 0 {
		t.Errorf("a cordoned node keeps spares: pods %v, spares %v", pods, s.spares.byGPU)
	}
	cordon(false)
	seen(false)
	s.spares.fill(ctx)
	if len(daemonPodNames(t, client)) != 2 || len(s.spares.ready) != 2 {
		t.Errorf("no spares again once uncordoned: %v", daemonPodNames(t, client))
	}
}
