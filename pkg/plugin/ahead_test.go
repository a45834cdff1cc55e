package plugin

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// boundPod is a pending pod of this node that names claim.
func boundPod(ns, name, uid, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)},
		Spec:       corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(claim)}}},
		Status:     corev1.PodStatus{Phase: corev1.PodPending},
	}
}

// settled waits until no daemon is being started ahead and n daemon pods exist.
func settled(t *testing.T, s *State, client *k8sfake.Clientset, n int) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		starting := len(s.foreign.starting)
		s.mu.Unlock()
		return starting == 0 && len(daemonPodNames(t, client)) == n, nil
	})
	if err != nil {
		t.Fatalf("want %d daemon pods and none starting; have %v", n, daemonPodNames(t, client))
	}
}

// aheadEnv is a plugin whose daemons run as pods, with claim (allocated here) in the API.
func aheadEnv(t *testing.T, claim *resourceapi.ResourceClaim) (*Driver, *k8sfake.Clientset, func() int) {
	e, client, kubelet := newPodEnv(t)
	if _, err := client.ResourceV1().ResourceClaims(claim.Namespace).Create(context.Background(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return &Driver{state: e.state(), client: client, cfg: e.cfg}, client, kubelet.Created
}

func TestMPSDaemonStartsWhenItsPodIsBound(t *testing.T) {
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	d, client, created := aheadEnv(t, withReservedFor(claim, "p", "pod-1"))
	s := d.state

	d.podSeen(ctx, boundPod("ns-a", "p", "pod-1", "a1"))
	settled(t, s, client, 1)
	d.podSeen(ctx, boundPod("ns-a", "p", "pod-1", "a1")) // the pod's next update
	if created() != 1 {
		t.Fatalf("daemon pods created: %d, want 1 (started once, before the prepare)", created())
	}
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if created() != 1 || len(daemonPodNames(t, client)) != 1 {
		t.Fatalf("the prepare started another daemon: %d created", created())
	}
	// Its claim took it: no check stops it, however late.
	s.mu.Lock()
	s.daemons.expireAhead(time.Now().Add(2 * aheadGrace))
	s.mu.Unlock()
	s.CheckMPS(ctx)
	if len(daemonPodNames(t, client)) != 1 {
		t.Fatal("a check stopped the daemon its prepared claim uses")
	}
}

func TestMPSDaemonStartedAheadGoesWhenNoClaimTakesIt(t *testing.T) {
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	d, client, _ := aheadEnv(t, withReservedFor(claim, "p", "pod-1"))
	s := d.state

	d.podSeen(ctx, boundPod("ns-a", "p", "pod-1", "a1"))
	settled(t, s, client, 1)
	s.CheckMPS(ctx)
	if len(daemonPodNames(t, client)) != 1 {
		t.Fatal("a check stopped a daemon started ahead before its grace passed")
	}
	// The pod went before its claim was prepared.
	s.mu.Lock()
	s.daemons.expireAhead(time.Now().Add(aheadGrace))
	s.mu.Unlock()
	s.CheckMPS(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 0 {
		t.Fatalf("a daemon no claim took is left: %v", pods)
	}
}

func TestMPSDaemonStartedAheadGoesWithARefusedPrepare(t *testing.T) {
	ctx := context.Background()
	// Another namespace holds most of the GPU already (an allocation the plugin did not
	// see go, or a stale one): the prepare refuses the claim.
	claim := builders.MakeClaim("ns-a", "a1").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	d, client, _ := aheadEnv(t, withReservedFor(claim, "p", "pod-1"))
	s := d.state
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-b", "b1").Memory("70Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	settled(t, s, client, 1)

	d.podSeen(ctx, boundPod("ns-a", "p", "pod-1", "a1"))
	settled(t, s, client, 2)
	if _, err := s.Prepare(ctx, claim); err == nil {
		t.Fatal("a claim the GPU has no room for was prepared: nothing to test")
	}
	s.CheckMPS(ctx)
	if pods := daemonPodNames(t, client); len(pods) != 1 {
		t.Fatalf("a refused claim's daemon is left: %v", pods)
	}
}

func TestNoMPSDaemonStartsAheadForAClaimNotReservedForThePod(t *testing.T) {
	ctx := context.Background()
	// The tenant's pod names another pod's claim (spec.resourceClaims is the tenant's to
	// write); the scheduler reserved it for the other pod only.
	claim := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	d, client, created := aheadEnv(t, withReservedFor(claim, "owner", "pod-owner"))

	d.podSeen(ctx, boundPod("ns-a", "intruder", "pod-2", "a1"))
	// A pod bound elsewhere, running, or on its way out starts nothing either.
	other := boundPod("ns-a", "owner", "pod-owner", "a1")
	other.Status.Phase = corev1.PodRunning
	d.podSeen(ctx, other)
	time.Sleep(200 * time.Millisecond)
	settled(t, d.state, client, 0)
	if created() != 0 {
		t.Fatalf("%d daemon pods created for a claim not reserved for the pod", created())
	}
}

func TestMPSDaemonOfPreparedClaimsIsNotStartedAhead(t *testing.T) {
	ctx := context.Background()
	first := builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	second := builders.MakeClaim("ns-a", "a2").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	d, client, created := aheadEnv(t, withReservedFor(second, "p2", "pod-2"))
	s := d.state
	if _, err := s.Prepare(ctx, first); err != nil {
		t.Fatal(err)
	}
	// Its daemon died under the prepared claim: restarting it (and telling its clients they
	// lost their server) is the prepare's and the MPS check's, not a bound pod's.
	key := s.cp.Claims[string(first.UID)].Devices[0].MPSKey
	for _, name := range daemonPodNames(t, client) {
		if err := client.CoreV1().Pods(pluginNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	d.podSeen(ctx, boundPod("ns-a", "p2", "pod-2", "a2"))
	time.Sleep(200 * time.Millisecond)
	settled(t, s, client, 0)
	if created() != 1 {
		t.Fatalf("daemon %s of a prepared claim was started ahead: %d pods created", key, created())
	}
}

// gatedLauncher holds each daemon's start until gate is closed.
type gatedLauncher struct {
	mps.Launcher
	gate chan struct{}
}

func (g gatedLauncher) Start(ctx context.Context, spec mps.DaemonSpec, replace bool) (bool, error) {
	<-g.gate
	return g.Launcher.Start(ctx, spec, replace)
}

func (g gatedLauncher) Protect(ctx context.Context, key string, protect bool) error {
	guard, ok := g.Launcher.(daemonGuard)
	if !ok {
		return nil
	}
	return guard.Protect(ctx, key, protect)
}

// A process fgpu did not start that lands on the GPU while the claim's daemon starts ahead
// is still seen by the claim's prepare, which waits for that start and then refuses a share
// promised enforced memory there.
func TestPrepareSeesForeignProcessesWhileItsDaemonStartsAhead(t *testing.T) {
	ctx := context.Background()
	claim := builders.MakeClaim("ns-a", "keep").Memory("10Gi").Config(keepGPU).AllocatedOn(node, "gpu-0").Obj()
	e, client, _ := newPodEnv(t)
	e.cfg.Fenced = true
	if _, err := client.ResourceV1().ResourceClaims("ns-a").Create(ctx, withReservedFor(claim, "p", "pod-1"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := e.state()
	gate := make(chan struct{})
	s.daemons.mps.Launcher = gatedLauncher{Launcher: s.daemons.mps.Launcher, gate: gate}
	d := &Driver{state: s, client: client, cfg: e.cfg}

	d.podSeen(ctx, boundPod("ns-a", "p", "pod-1", "keep"))
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.foreign.starting) > 0, nil
	}); err != nil {
		t.Fatal("no daemon started ahead")
	}
	e.foreignProcesses(0, "99")
	done := make(chan error, 1)
	go func() { _, err := s.Prepare(ctx, claim); done <- err }()
	time.Sleep(200 * time.Millisecond)
	close(gate)
	if err := <-done; err == nil {
		t.Fatal("a share promised enforced memory was prepared on a GPU that runs a process fgpu did not start")
	}
}
