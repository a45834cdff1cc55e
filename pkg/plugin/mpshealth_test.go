package plugin

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// tenantClaim prepares a claim on gpu-1 for one pod of the namespace, both in the API.
func (e *env) tenantClaim(s *State, ns, name string) *resourceapi.ResourceClaim {
	e.t.Helper()
	ctx := context.Background()
	claim := builders.MakeClaim(ns, name).Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-pod", UID: types.UID(name + "-pod-uid")}, Spec: corev1.PodSpec{NodeName: node}}
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	if _, err := e.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, claim); err != nil {
		e.t.Fatal(err)
	}
	return claim
}

// evicted lists "<namespace>/<pod>" of the evictions asked for.
func (e *env) evicted() []string {
	e.t.Helper()
	client, ok := e.client.(*k8sfake.Clientset)
	if !ok {
		e.t.Fatalf("client %T records no actions", e.client)
	}
	var out []string
	for _, a := range client.Actions() {
		c, ok := a.(k8stesting.CreateAction)
		if !ok || a.GetSubresource() != "eviction" {
			continue
		}
		if o, ok := c.GetObject().(metav1.Object); ok {
			out = append(out, o.GetNamespace()+"/"+o.GetName())
		}
	}
	return out
}

// killDaemonOf removes the control socket of a claim's daemon, as its tenant can (the pipe
// directory is a read-write bind mount), and kills the orphaned stand-in at the end.
func (e *env) killDaemonOf(s *State, claim *resourceapi.ResourceClaim) string {
	e.t.Helper()
	key := s.cp.Claims[string(claim.UID)].Devices[0].MPSKey
	pipe := s.daemons.mps.PipeDir(key)
	if raw, err := os.ReadFile(filepath.Join(pipe, fakecontrol.PIDFile)); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(raw))); err == nil {
			e.t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
	if err := os.Remove(filepath.Join(pipe, "control")); err != nil {
		e.t.Fatal(err)
	}
	return key
}

// A tenant can make its own MPS daemon stop answering. That is one isolation domain's
// daemon: the GPU gets no taint (no NoExecute evicting every other namespace's pods, no
// flapping count); the plugin restarts the daemon and moves only that daemon's pods.
func TestOneTenantsDeadDaemonIsRestartedAndOnlyItsPodsMoved(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	a := e.tenantClaim(s, "tenant-a", "a")
	b := e.tenantClaim(s, "tenant-b", "b")
	keyA, keyB := s.cp.Claims[string(a.UID)].Devices[0].MPSKey, s.cp.Claims[string(b.UID)].Devices[0].MPSKey
	if keyA == keyB {
		t.Fatalf("one daemon for two namespaces: %s", keyA)
	}
	e.killDaemonOf(s, a)
	d := e.driver(s, e.backend())
	d.client = e.client
	for i := range mpsDeadChecks {
		faults := s.CheckMPS(ctx)
		d.moveMPSClients(ctx, faults)
		if i < mpsDeadChecks-1 && len(faults) != 0 {
			t.Fatalf("check %d: one failed check is taken for a dead daemon: %+v", i+1, faults)
		}
	}
	if !s.daemons.mps.Running(ctx, keyA) {
		t.Error("the dead daemon was not restarted")
	}
	if got := e.evicted(); !slices.Equal(got, []string{"tenant-a/a-pod"}) {
		t.Errorf("evicted %v, want tenant-a's pod only", got)
	}
	evs, err := e.client.CoreV1().Events("tenant-a").List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) != 1 || evs.Items[0].Reason != ReasonMPSServerLost || !strings.Contains(evs.Items[0].Message, "died") {
		t.Errorf("tenant-a's pod events %+v (%v)", evs, err)
	}
	d.health.refresh(ctx)
	if got := d.health.taints(s.Devices()[1].UUID); len(got) != 0 {
		t.Errorf("one tenant's daemon tainted the GPU: %v", taintStrings(got))
	}
	// Once its claims are unprepared (the pods gone), the restarted daemon serves new ones.
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	if got := s.CheckMPS(ctx); len(got) != 0 {
		t.Errorf("the fault outlived its claims: %+v", got)
	}
}

// The reviewer's case: a tenant removes its daemon's control socket; no poll puts a
// NoExecute taint on the GPU.
func TestOneTenantsDaemonDoesNotEvictTheGPU(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	a := e.tenantClaim(s, "tenant-a", "a")
	e.tenantClaim(s, "tenant-b", "b")
	e.killDaemonOf(s, a)
	d := e.driver(s, e.backend())
	for range mpsDeadChecks + 1 {
		s.CheckMPS(ctx)
		d.health.refresh(ctx)
		for _, tt := range d.health.taints(s.Devices()[1].UUID) {
			t.Errorf("tenant-a's daemon put %s=%s:%s on gpu-1", tt.Key, tt.Value, tt.Effect)
		}
	}
}

// An MPS server in NVIDIA's FAULT state still answers, but refuses new clients until all
// of its clients exited: those clients are moved, until it is ACTIVE again; the GPU and
// the other domains' pods are left alone.
func TestMPSServerInFaultMovesOnlyItsClients(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	a := e.tenantClaim(s, "tenant-a", "a")
	e.tenantClaim(s, "tenant-b", "b")
	key := s.cp.Claims[string(a.UID)].Devices[0].MPSKey
	fault := filepath.Join(s.daemons.mps.LogDir(key), fakecontrol.FaultFile)
	if err := os.WriteFile(fault, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d := e.driver(s, e.backend())
	d.client = e.client
	faults := s.CheckMPS(ctx)
	if len(faults) != 1 || faults[0].Key != key || len(faults[0].Claims) != 1 || faults[0].Claims[0].UID != a.UID || !strings.Contains(faults[0].Message, "FAULT") {
		t.Fatalf("faults %+v", faults)
	}
	d.moveMPSClients(ctx, faults)
	d.moveMPSClients(ctx, s.CheckMPS(ctx)) // tried again while the pod is there; told once
	if got := e.evicted(); !slices.Equal(got, []string{"tenant-a/a-pod", "tenant-a/a-pod"}) {
		t.Errorf("evicted %v", got)
	}
	if evs, _ := e.client.CoreV1().Events("tenant-a").List(ctx, metav1.ListOptions{}); len(evs.Items) != 1 {
		t.Errorf("%d events for one eviction", len(evs.Items))
	}
	d.health.refresh(ctx)
	if got := d.health.taints(s.Devices()[1].UUID); len(got) != 0 {
		t.Errorf("a server in FAULT tainted the GPU: %v", taintStrings(got))
	}
	if err := os.Remove(fault); err != nil {
		t.Fatal(err)
	}
	if got := s.CheckMPS(ctx); len(got) != 0 {
		t.Errorf("an ACTIVE server again: %+v", got)
	}
}

// A daemon that died with prepared claims while the plugin was down is restarted at the
// plugin's start, but its clients lost their server: they are moved until those claims are
// unprepared.
func TestMPSDaemonDeadAtRestartMovesItsClients(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	claim := e.tenantClaim(s, "ns", "a")
	keys, _ := s.daemons.mps.Keys(ctx)
	if len(keys) != 1 {
		t.Fatalf("daemons %v", keys)
	}
	if err := s.daemons.mps.Stop(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	s2 := e.state() // the plugin restarts
	if !s2.daemons.mps.Running(ctx, keys[0]) {
		t.Fatal("the daemon of a prepared claim was not restarted")
	}
	faults := s2.CheckMPS(ctx)
	if len(faults) != 1 || len(faults[0].Claims) != 1 || faults[0].Claims[0].UID != claim.UID {
		t.Fatalf("after the restart: %+v", faults)
	}
	if err := s2.Unprepare(ctx, string(claim.UID)); err != nil {
		t.Fatal(err)
	}
	if got := s2.CheckMPS(ctx); len(got) != 0 {
		t.Errorf("the fault outlived its claims: %+v", got)
	}
}

// The poll's context is cancelled at SIGTERM: a daemon that could not be asked is not a
// dead one, and no number of cancelled checks restarts it.
func TestCancelledPollIsNoMPSFault(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	claim := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	if _, err := s.Prepare(context.Background(), claim); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for range mpsDeadChecks {
		if got := s.CheckMPS(ctx); len(got) != 0 {
			t.Errorf("a running daemon reported dead because the poll was cancelled: %+v", got)
		}
	}
	if len(s.daemons.unanswered) != 0 || len(s.daemons.diedUnder) != 0 {
		t.Errorf("cancelled checks counted: unanswered %v, died %v", s.daemons.unanswered, s.daemons.diedUnder)
	}
}
