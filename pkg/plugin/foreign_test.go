package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// setMode sets a fake GPU's compute mode as an admin would, before or between plugin runs.
func (e *env) setMode(device string, mode gpu.ComputeMode) {
	e.t.Helper()
	b := e.backend()
	devs, _ := b.Devices()
	for _, d := range devs {
		if d.Name() == device {
			if err := b.SetComputeMode(d.UUID, mode); err != nil {
				e.t.Fatal(err)
			}
			return
		}
	}
	e.t.Fatalf("no %s", device)
}

// foreignProcesses puts processes fgpu did not start on a fake GPU (none: takes them off).
func (e *env) foreignProcesses(index int, pids ...string) {
	e.t.Helper()
	path := fake.ProcessFile(e.cfg.DevRoot, index)
	if len(pids) == 0 {
		if err := os.Remove(path); err != nil {
			e.t.Fatal(err)
		}
		return
	}
	if err := os.MkdirAll(e.cfg.DevRoot, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(strings.Join(pids, "\n")+"\n"), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func taints(res []resourceapi.Device, name string) []resourceapi.DeviceTaint {
	for _, d := range res {
		if d.Name == name {
			return d.Taints
		}
	}
	return nil
}

// Installing fgpu changes no compute mode on a GPU it does not use, and the mode it changes
// on one it uses goes back to what an admin set when its last claim goes, also across a
// restart of the plugin in between.
func TestAdminComputeModesAreKept(t *testing.T) {
	e := newEnv(t)
	e.setMode("gpu-0", gpu.ComputeModeProhibited)
	e.setMode("gpu-1", gpu.ComputeModeExclusiveProcess)
	s := e.state()
	ctx := context.Background()
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("start-up reset an unused GPU's mode to %s", m)
	}
	claim := builders.MakeClaim("ns", "mps").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("one MPS server wants EXCLUSIVE_PROCESS, got %s", m)
	}
	s = e.state()
	if err := s.Unprepare(ctx, string(claim.UID)); err != nil {
		t.Fatal(err)
	}
	if m0, m1 := computeMode(t, s, "gpu-0"), computeMode(t, s, "gpu-1"); m0 != gpu.ComputeModeProhibited || m1 != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("after the last claim went: gpu-0 %s (want the admin's Prohibited back), gpu-1 %s (want ExclusiveProcess untouched)", m0, m1)
	}
	if len(s.cp.FoundComputeModes) != 0 {
		t.Fatalf("restored modes still recorded: %v", s.cp.FoundComputeModes)
	}
}

// A GPU with processes fgpu did not start is published with a NoSchedule taint, keeps its
// compute mode, and is offered again once they exit; a report says each change.
func TestForeignProcessesTaintTheGPUUntilTheyExit(t *testing.T) {
	e := newEnv(t)
	e.setMode("gpu-1", gpu.ComputeModeExclusiveProcess)
	e.foreignProcesses(1, "4242", "77")
	s := e.state()
	ctx := context.Background()
	changes := s.RefreshForeign(ctx)
	if len(changes) != 1 || changes[0].Device != "gpu-1" || !slices.Equal(changes[0].PIDs, []int{77, 4242}) ||
		!strings.Contains(changes[0].Message(), "GPU gpu-1 ("+changes[0].UUID+") runs 2 process(es) fgpu did not start; it is not offered until they exit") {
		t.Fatalf("changes: %+v", changes)
	}
	if again := s.RefreshForeign(ctx); len(again) != 0 {
		t.Fatalf("an unchanged GPU reported again: %+v", again)
	}
	res := DriverResources(node, s.Devices(), e.cfg.ReservedMemory, true, s.Foreign(), nil, nil).Pools[node].Slices[0].Devices
	want := resourceapi.DeviceTaint{Key: configapi.ForeignTaintKey, Value: "2", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	if got := taints(res, "gpu-1"); len(got) != 2 || got[0] != configapi.FenceTaint() || got[1] != want {
		t.Fatalf("gpu-1 taints %+v, want the fence and %+v", got, want)
	}
	if got := taints(res, "gpu-0"); len(got) != 1 {
		t.Fatalf("gpu-0 taints %+v, want only the fence", got)
	}

	// A share allocated there before the taint (not promised enforced memory) is prepared;
	// the GPU keeps its mode.
	claim := builders.MakeClaim("ns", "early").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("fgpu changed a foreign-busy GPU's mode to %s", m)
	}
	if err := s.Unprepare(ctx, string(claim.UID)); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("unprepare changed a foreign-busy GPU's mode to %s", m)
	}

	e.foreignProcesses(1)
	changes = s.RefreshForeign(ctx)
	if len(changes) != 1 || len(changes[0].PIDs) != 0 || !strings.Contains(changes[0].Message(), "runs no process fgpu did not start any more; it is offered again") {
		t.Fatalf("changes after the processes exited: %+v", changes)
	}
	res = DriverResources(node, s.Devices(), e.cfg.ReservedMemory, false, s.Foreign(), nil, nil).Pools[node].Slices[0].Devices
	if got := taints(res, "gpu-1"); len(got) != 0 {
		t.Fatalf("gpu-1 still tainted: %+v", got)
	}
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("a GPU fgpu never changed got mode %s", m)
	}
}

// A share promised enforced memory is refused on a GPU with processes fgpu did not start,
// also before the poll saw them, with a refusal the allocator acts on; the GPU keeps its mode.
func TestEnforcedShareRefusedOnAForeignBusyGPU(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	e.foreignProcesses(0, "99")
	claim := builders.MakeClaim("ns", "keep").Memory("10Gi").Config(keepGPU).AllocatedOn(node, "gpu-0").Obj()
	_, err := s.Prepare(ctx, claim)
	var rf *refusal
	if !errors.As(err, &rf) || rf.reason != configapi.PrepareReasonIsolationConflict || rf.device != "gpu-0" ||
		!strings.Contains(err.Error(), "it runs 1 process(es) fgpu did not start") {
		t.Fatalf("want an IsolationConflict refusal, got %v", err)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("compute mode became %s", m)
	}
	if e.specCount() != 0 {
		t.Fatal("a refused claim left a spec")
	}
}

// Each change becomes a Node event a person can act on: a Warning while the processes run,
// a Normal one when the GPU is offered again.
func TestForeignChangesBecomeNodeEvents(t *testing.T) {
	e := newEnv(t)
	client := k8sfake.NewClientset()
	// The fake clientset does not generate names as the API server does.
	n := 0
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		create, ok := a.(k8stesting.CreateAction)
		if !ok {
			return false, nil, nil
		}
		if ev, ok := create.GetObject().(*corev1.Event); ok {
			n++
			ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, n)
		}
		return false, nil, nil
	})
	e.client = client
	e.foreignProcesses(0, "5")
	s := e.state()
	ctx := context.Background()
	d := &Driver{state: s, client: e.client, cfg: e.cfg}
	d.reportForeign(ctx, s.RefreshForeign(ctx))
	e.foreignProcesses(0)
	d.reportForeign(ctx, s.RefreshForeign(ctx))
	evs := events(t, e)
	if len(evs) != 2 {
		t.Fatalf("events: %+v", evs)
	}
	slices.SortFunc(evs, func(a, b corev1.Event) int { return strings.Compare(string(b.Type), string(a.Type)) })
	if evs[0].Type != corev1.EventTypeWarning || evs[0].Reason != ReasonForeignProcesses || evs[0].InvolvedObject.Name != node ||
		!strings.Contains(evs[0].Message, "GPU gpu-0 (") || !strings.Contains(evs[0].Message, "runs 1 process(es) fgpu did not start;") {
		t.Errorf("first event: %+v", evs[0])
	}
	if evs[1].Type != corev1.EventTypeNormal || evs[1].Reason != ReasonForeignProcessesGone {
		t.Errorf("second event: %+v", evs[1])
	}
}

// A foreign job ran when a share that promises no memory cap was prepared next to it; when the
// job exits the GPU is no longer tainted, though fgpu's claim stays.
func TestForeignVerdictDropsExitedProcessesWhileClaimsStay(t *testing.T) {
	e := newEnv(t)
	e.foreignProcesses(0, "99")
	s := e.state()
	ctx := context.Background()
	s.RefreshForeign(ctx)
	claim := builders.MakeClaim("ns", "ts").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatalf("a share without enforced memory was refused on a foreign-busy GPU: %v", err)
	}
	e.foreignProcesses(0, "99", "100") // 100 came with fgpu's claim: its tenant's
	s.RefreshForeign(ctx)
	if f := s.Foreign(); !slices.Equal(f["gpu-0"], []int{99}) {
		t.Fatalf("gpu-0 foreign %v, want [99]: a process started while fgpu has a claim there is its tenant's", f["gpu-0"])
	}
	e.foreignProcesses(0, "100") // the foreign job exits
	if ch := s.RefreshForeign(ctx); len(ch) != 1 || len(ch[0].PIDs) != 0 {
		t.Fatalf("changes %+v, want gpu-0 free", ch)
	}
	if f := s.Foreign(); len(f["gpu-0"]) != 0 {
		t.Fatalf("foreign process 99 exited, gpu-0 still tainted as running %v while fgpu's claim stays", f["gpu-0"])
	}
}

// A checkpoint of a version that did not record the compute modes it changed: the plugin put
// gpu-0 in EXCLUSIVE_PROCESS for its one MPS domain and would have reset it to Default with the
// last claim. After the upgrade the last claim's unprepare sets it back to Default.
func TestUpgradeFromACheckpointWithoutFoundModesResetsExclusiveProcess(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns", "mps").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("gpu-0 is %s", m)
	}
	s.cp.FoundComputeModes, s.cp.ComputeModesRecorded = nil, false // what the old version wrote
	if err := s.store.Save(s.cp); err != nil {
		t.Fatal(err)
	}
	s = e.state() // the upgraded plugin
	if err := s.Unprepare(ctx, string(claim.UID)); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("after the upgrade and the last claim, gpu-0 stays %s for good", m)
	}
	if !s.cp.ComputeModesRecorded {
		t.Fatal("the migrated checkpoint does not say its modes are recorded")
	}
}

// NVML lists fgpu's own MPS servers among a GPU's processes. One that a gone claim left behind
// at a restart, or that is still exiting after the last claim went, is not foreign.
func TestOwnMPSServersAreNotForeign(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns", "mps").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(fake.ServerFile(e.cfg.DevRoot, 0))
	if err != nil || strings.TrimSpace(string(raw)) == "" {
		t.Fatalf("the stand-in MPS server is not listed on gpu-0: %q, %v", raw, err)
	}
	// The claim goes while the plugin is down: its daemon is left behind.
	delete(s.cp.Claims, string(claim.UID))
	if err := s.store.Save(s.cp); err != nil {
		t.Fatal(err)
	}
	s = e.state()
	if f := s.Foreign(); len(f) != 0 {
		t.Fatalf("fgpu's own left-over MPS server taken as foreign: %v", f)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("gpu-0 left in %s", m)
	}
	for range 3 { // the server unlists itself as it exits
		if ch := s.RefreshForeign(ctx); len(ch) != 0 {
			t.Fatalf("changes %+v after fgpu's own server stopped", ch)
		}
	}
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := s.Unprepare(ctx, string(claim.UID)); err != nil {
		t.Fatal(err)
	}
	if ch := s.RefreshForeign(ctx); len(ch) != 0 {
		t.Fatalf("changes %+v after the last claim's MPS server stopped", ch)
	}
}

// A tenant replaces its daemon's control socket (its pipe directory is mounted read-write
// into its containers) with one of its own that names a process fgpu did not start, here the
// node's init, as the daemon's MPS server. That process still makes its GPU foreign-busy: a
// tenant cannot vouch for another workload's processes, nor take a GPU it runs on.
func TestATenantsControlSocketCannotVouchForForeignProcesses(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns-a", "a1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	keys, err := s.daemons.mps.DirKeys()
	if err != nil || len(keys) != 1 {
		t.Fatalf("keys %v, %v", keys, err)
	}
	st, err := fakecontrol.ReadState(s.daemons.mps.LogDir(keys[0]))
	if err != nil {
		t.Fatal(err)
	}
	ctl := filepath.Join(s.daemons.mps.PipeDir(keys[0]), "control")
	if err := os.Remove(ctl); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", ctl)
	if err != nil {
		t.Fatal(err)
	}
	// Before the state's clean-up, which stops the daemons: the tenant's socket goes, and the
	// daemon it hid is stopped by hand.
	t.Cleanup(func() { l.Close(); _ = syscall.Kill(st.PID, syscall.SIGTERM) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, c)
			_, _ = c.Write([]byte("1\n"))
			c.Close()
		}
	}()
	e.foreignProcesses(1, "1")
	changes := s.RefreshForeign(ctx)
	if len(changes) != 1 || changes[0].Device != "gpu-1" || !slices.Equal(changes[0].PIDs, []int{1}) {
		t.Fatalf("changes %+v; want gpu-1 foreign-busy with PID 1, whatever the tenant's socket says", changes)
	}
	if f := s.Foreign(); !slices.Equal(f["gpu-1"], []int{1}) {
		t.Fatalf("foreign %v; want gpu-1: [1]", f)
	}
}

// Outside the node's PID namespace NVML lists only the plugin's own processes: nothing is
// judged foreign, whatever the backend lists.
func TestOwnPIDNamespaceJudgesNoGPUForeign(t *testing.T) {
	e := newEnv(t)
	e.cfg.OwnPIDNamespace = true
	e.foreignProcesses(1, "4242")
	s := e.state()
	ctx := context.Background()
	if ch := s.RefreshForeign(ctx); len(ch) != 0 {
		t.Fatalf("changes %+v outside the node's PID namespace", ch)
	}
	claim := builders.MakeClaim("ns", "mps").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
}

// A whole-GPU claim wants no compute mode: an unprepare on another GPU (or a restart's
// recover) leaves the admin's mode of the GPU the whole-GPU tenant uses alone.
func TestWholeGPUClaimKeepsItsGPUsModeAcrossOtherUnprepares(t *testing.T) {
	e := newEnv(t)
	e.setMode("gpu-1", gpu.ComputeModeExclusiveProcess)
	s := e.state()
	ctx := context.Background()
	whole := builders.MakeClaim("ns", "whole").Class(configapi.DeviceClassExclusive).AllocatedOn(node, "gpu-1").Obj()
	if _, err := s.Prepare(ctx, whole); err != nil {
		t.Fatal(err)
	}
	other := builders.MakeClaim("ns", "other").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := s.Unprepare(ctx, string(other.UID)); err != nil {
		t.Fatal(err)
	}
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("an unprepare on gpu-0 set the whole-GPU tenant's gpu-1 to %s", m)
	}
	s = e.state() // recover
	if m := computeMode(t, s, "gpu-1"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("a restart set the whole-GPU tenant's gpu-1 to %s", m)
	}
}

// A job that replaces one process by another makes no report (no event, no republish); a
// change in the number does.
func TestForeignChurnIsReportedOnlyWhenTheCountChanges(t *testing.T) {
	e := newEnv(t)
	e.foreignProcesses(1, "5")
	s := e.state()
	ctx := context.Background()
	if ch := s.RefreshForeign(ctx); len(ch) != 1 {
		t.Fatalf("changes %+v, want gpu-1 busy", ch)
	}
	e.foreignProcesses(1, "6")
	if ch := s.RefreshForeign(ctx); len(ch) != 0 {
		t.Fatalf("one process replaced by another reported: %+v", ch)
	}
	e.foreignProcesses(1, "6", "7")
	if ch := s.RefreshForeign(ctx); len(ch) != 1 || !slices.Equal(ch[0].PIDs, []int{6, 7}) {
		t.Fatalf("changes %+v, want gpu-1 with 2 processes", ch)
	}
}

// A GPU whose processes cannot be listed is logged once per error, not at every poll.
func TestAFailingProcessListingIsLoggedOnce(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	var lines []string
	ctx := klog.NewContext(context.Background(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	e.foreignProcesses(1, "not-a-pid")
	for range 3 {
		s.RefreshForeign(ctx)
	}
	if n := countContaining(lines, "Listing the compute processes of a GPU;"); n != 1 {
		t.Fatalf("the failing listing logged %d times, want once: %q", n, lines)
	}
	e.foreignProcesses(1)
	s.RefreshForeign(ctx)
	e.foreignProcesses(1, "still-not-a-pid")
	s.RefreshForeign(ctx)
	if n := countContaining(lines, "Listing the compute processes of a GPU;"); n != 2 {
		t.Fatalf("a failure after a recovery logged %d times in all, want 2: %q", n, lines)
	}
}

func countContaining(lines []string, s string) int {
	n := 0
	for _, l := range lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// A restart that rolls back a prepare cut short finds the claim's MPS server running, with
// no prepared claim on its GPU (the kubelet prepares the claim again and reuses the server):
// that server is fgpu's, never foreign.
func TestServerOfARolledBackPrepareIsNotForeign(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns", "cut").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
	entry := s.cp.Claims[string(claim.UID)]
	entry.State = checkpoint.PrepareStarted
	if err := s.store.Save(s.cp); err != nil {
		t.Fatal(err)
	}
	s = e.state()
	if f := s.Foreign(); len(f) != 0 {
		t.Fatalf("the server of a rolled-back prepare taken as foreign at start: %v", f)
	}
	if ch := s.RefreshForeign(ctx); len(ch) != 0 {
		t.Fatalf("changes %+v: fgpu's own server taken as foreign", ch)
	}
	if _, err := s.Prepare(ctx, claim); err != nil {
		t.Fatal(err)
	}
}
