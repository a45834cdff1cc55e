package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// wedge makes a domain's daemon stop answering while its pod keeps running, as a tenant can:
// the pipe directory is mounted read-write into its containers, so `rm $CUDA_MPS_PIPE_DIRECTORY/control`.
func wedge(t *testing.T, s *State) string {
	t.Helper()
	keys, err := s.daemons.mps.DirKeys()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	if err := os.Remove(filepath.Join(s.daemons.mps.PipeDir(keys[0]), "control")); err != nil {
		t.Fatal(err)
	}
	if s.daemons.mps.Running(context.Background(), keys[0]) {
		t.Fatal("still answers")
	}
	return keys[0]
}

// A daemon pod that runs but whose daemon does not answer is adopted as it is by every later
// Ensure, so the domain would never get a working daemon again: it is replaced once it did
// not answer within StartTimeout.
func TestAdoptedDaemonThatDoesNotAnswerIsReplaced(t *testing.T) {
	e, _, _ := newPodEnv(t)
	s := e.state()
	s.daemons.mps.StartTimeout = 2 * time.Second
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	wedge(t, s)
	for i := range 2 {
		if _, err := s.Prepare(ctx, builders.MakeClaim("ns-a", "a2").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
			t.Errorf("prepare %d of the domain after its daemon stopped answering: %v", i, err)
		}
	}
}

// The wait for a launched daemon (up to StartTimeout, 30s by default; plus up to 30s for a
// pod to be deleted) runs without State.mu: one namespace's broken daemon must not hold up
// another namespace's prepare or unprepare on the node (the kubelet gives each 45s).
func TestOneDomainsDaemonDoesNotHoldUpOtherNamespaces(t *testing.T) {
	e, _, _ := newPodEnv(t)
	s := e.state()
	s.daemons.mps.StartTimeout = 4 * time.Second
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	wedge(t, s)
	go func() {
		_, _ = s.Prepare(ctx, builders.MakeClaim("ns-a", "a2").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj())
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-b", "b1").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("ns-b's prepare on another GPU waited %v for ns-a's daemon", d)
	}
}

// rollback deletes and saves the checkpoint entry before it stops the daemons no claim uses;
// when that fails (the pod List, a pod not gone within 30s) Unprepare returns the error, and
// the kubelet's retry, which finds no entry, must still stop them: else the daemon pod, its
// tmpfs and directories would stay until another claim of the node is unprepared.
func TestFailedDaemonStopIsRetried(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failed.CompareAndSwap(false, true) {
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	err1 := s.Unprepare(ctx, string(claim.UID))
	err2 := s.Unprepare(ctx, string(claim.UID))
	t.Logf("unprepare: %v, then %v", err1, err2)
	if pods := daemonPodNames(t, client); len(pods) != 0 || mountsUnder(t, e.cfg.MPSRoot) != 0 {
		t.Errorf("after the claim was unprepared (kubelet retried until nil): daemon pods %v, %d shm mounts left", pods, mountsUnder(t, e.cfg.MPSRoot))
	}
}

// slowOnceLauncher is the chart's PodLauncher; the daemon's socket is out of reach until the
// first Start, as a daemon that is slow to answer one get_server_list at the plugin's start.
type slowOnceLauncher struct {
	*mps.PodLauncher
	sock string
}

func (l *slowOnceLauncher) Start(ctx context.Context, spec mps.DaemonSpec, replace bool) (bool, error) {
	_ = os.Rename(l.sock+".away", l.sock)
	return l.PodLauncher.Start(ctx, spec, replace)
}

// One unanswered get_server_list at the plugin's start (a slow daemon on a loaded node) is no
// dead daemon: when Ensure adopts the very same running pod and daemon, no Node event is
// recorded and no pod of the domain is moved (daemonWasDown only for a daemon created anew).
func TestRestartDoesNotEvictADomainWhoseDaemonNeverDied(t *testing.T) {
	e, client, kubelet := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	before := daemonPIDs(t, s)
	var key string
	for k := range before {
		key = k
	}
	sock := filepath.Join(s.daemons.mps.PipeDir(key), "control")
	if err := os.Rename(sock, sock+".away"); err != nil {
		t.Fatal(err)
	}
	e.cfg.MPSLauncher = &slowOnceLauncher{PodLauncher: &mps.PodLauncher{Client: client, Namespace: pluginNS, NodeName: node,
		Image: "fgpu.dev/fgpu:dev", HostPaths: []string{e.cfg.DevRoot}}, sock: sock}
	restarted := e.state()
	if after := daemonPIDs(t, restarted); fmt.Sprint(after) != fmt.Sprint(before) || kubelet.Created() != 1 {
		t.Fatalf("the daemon was replaced: %v -> %v, %d pods created", before, after, kubelet.Created())
	}
	if faults := restarted.CheckMPS(ctx); len(faults) != 0 {
		t.Errorf("the same daemon, adopted, yet its claims' pods are to be evicted: %+v", faults)
	}
}

// Without a retry of the unprepare, the MPS check (every few seconds) stops the daemon no
// claim uses any more.
func TestFailedDaemonStopIsRetriedByTheMPSCheck(t *testing.T) {
	e, client, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failed.CompareAndSwap(false, true) {
			return true, nil, errors.New("API server unavailable")
		}
		return false, nil, nil
	})
	if err := s.Unprepare(ctx, string(claim.UID)); err == nil {
		t.Fatal("the unprepare whose daemon stop failed returned nil")
	}
	s.CheckMPS(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 0 || mountsUnder(t, e.cfg.MPSRoot) != 0 {
		t.Errorf("after the MPS check: daemon pods %v, %d shm mounts left", pods, mountsUnder(t, e.cfg.MPSRoot))
	}
}

// The kubelet prepares claims concurrently: the first claims of a domain, prepared at once,
// find its daemon not yet started. The one whose prepare starts it must not take the others,
// still being prepared, for clients that lost their server.
func TestConcurrentFirstPreparesOfADomainEvictNothing(t *testing.T) {
	e, _, _ := newPodEnv(t)
	s := e.state()
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = s.Prepare(ctx, builders.MakeClaim("ns-a", fmt.Sprintf("a%d", i)).Memory("10Gi").AllocatedOn(node, "gpu-0").Obj())
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if faults := s.CheckMPS(ctx); len(faults) != 0 {
		t.Errorf("claims prepared together, yet their pods are to be evicted: %+v", faults)
	}
}
