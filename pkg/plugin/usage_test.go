package plugin

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// fakeProc lays out /proc/<pid>/cgroup and environ as the kernel shows them.
func fakeProc(t *testing.T, root string, pid int, cgroup string, env ...string) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var environ []byte
	for _, kv := range env {
		environ = append(append(environ, kv...), 0)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "environ"), environ, 0o644); err != nil {
		t.Fatal(err)
	}
}

func livePID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("sleep", "300")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd.Process.Pid
}

// Each process's use goes to the claim of the pod whose cgroup it is in, whatever the
// process's environment or cgroups nested below say; a process in no pod goes by the share ID
// in its environment; fgpu's own processes and other pods count for no claim.
func TestUsageIsMeasuredPerClaimAndReportedWithinBudget(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, a, []checkpoint.PodRef{{UID: podA, Name: "pa"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PrepareFor(ctx, b, []checkpoint.PodRef{{UID: podB, Name: "pb"}}); err != nil {
		t.Fatal(err)
	}
	shareA := string(*a.Status.Allocation.Devices.Results[0].ShareID)
	shareB := string(*b.Status.Allocation.Devices.Results[0].ShareID)

	proc := t.TempDir()
	inA, inB, noPod, otherPod := livePID(t), livePID(t), livePID(t), livePID(t)
	// A's process claims to be B's share: its pod decides.
	fakeProc(t, proc, inA, "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"+underscores(podA)+".slice/cri-containerd-1.scope\n", "FGPU_SHARE_ID="+shareB)
	// B's process nested a cgroup named after A's pod below its own.
	fakeProc(t, proc, inB, "12:memory:/kubepods/burstable/pod"+podB+"/c2/pod"+podA+"\n0::/kubepods/burstable/pod"+podB+"/c2/pod"+podA+"\n")
	fakeProc(t, proc, noPod, "0::/system.slice/gpucheck.scope\n", "FGPU_SHARE_ID="+shareA)
	fakeProc(t, proc, otherPod, "0::/kubepods/pod99999999-2222-3333-4444-555555555555/c\n", "FGPU_SHARE_ID="+shareA)
	dev := e.cfg.DevRoot
	report := func(pid int, gib int64, sm int) {
		t.Helper()
		if err := fake.ReportUsage(dev, 0, pid, gib<<30, sm, 0); err != nil {
			t.Fatal(err)
		}
	}
	report(inA, 3, 30)
	report(noPod, 1, -1)
	report(inB, 12, 50)
	report(otherPod, 40, 90)

	m := newUsageMeter(e.backend(), proc, 5*time.Minute, 30*time.Minute)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := t0.Add
	for i := range 30 { // every 10 s for 5 min
		if due, _ := m.sample(ctx, at(time.Duration(i)*10*time.Second), s.PreparedClaims(), nil); len(due) != 0 {
			t.Fatalf("a report was due after %d samples, before the report interval: %v", i+1, due)
		}
	}
	due, _ := m.sample(ctx, at(5*time.Minute), s.PreparedClaims(), nil)
	if len(due) != 2 {
		t.Fatalf("due %v; want both claims after the report interval", due)
	}
	sums := m.summaries(string(a.UID), at(5*time.Minute))
	ka := shareKey{string(a.UID), "gpu", "gpu-0"}
	if u := sums[ka]; u.MemoryMaxBytes != 4<<30 || u.SMMaxPercent != 30 || u.Samples != 31 || u.SMSamples != 31 {
		t.Fatalf("claim a: %+v; want 4Gi (its pod's process and the pod-less one naming its share), SM 30, 31 samples", u)
	}
	sumsB := m.summaries(string(b.UID), at(5*time.Minute))
	if u := sumsB[shareKey{string(b.UID), "gpu", "gpu-0"}]; u.MemoryMaxBytes != 12<<30 || u.SMP95Percent != 50 {
		t.Fatalf("claim b: %+v; want 12Gi at SM 50 (nothing of the other pod)", u)
	}

	// The newest sample is served as metrics.
	reg := prometheus.NewRegistry()
	metrics := NewMetrics(reg)
	metrics.observeUsage(s.PreparedClaims(), m.latest())
	if got := testutil.ToFloat64(metrics.claimUsed.WithLabelValues("ns", "a", "gpu-0")); got != 4<<30 {
		t.Errorf("fgpu_claim_memory_used_bytes of a = %v; want 4Gi", got)
	}
	if got := testutil.ToFloat64(metrics.claimSM.WithLabelValues("ns", "b", "gpu-0")); got != 50 {
		t.Errorf("fgpu_claim_sm_active_percent of b = %v; want 50", got)
	}

	// The summary lands in the claim's status.devices[].data.usage.
	client := k8sfake.NewClientset(a.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, usage: m}
	if err := d.publishDeviceStatusWith(ctx, a, sums); err != nil {
		t.Fatal(err)
	}
	m.published(sums, at(5*time.Minute))
	if got := statusUsage(t, client, a); got == nil || got.MemoryMaxBytes != 4<<30 {
		t.Fatalf("status usage %+v; want 4Gi peak", got)
	}
	// A later status write (a prepare) keeps the last report.
	if err := d.publishDeviceStatus(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got := statusUsage(t, client, a); got == nil || got.MemoryMaxBytes != 4<<30 {
		t.Fatalf("after another status write: %+v; want the report kept", got)
	}

	// Unchanged use is not written again until the heartbeat; a change waits for the interval.
	m.published(sumsB, at(5*time.Minute))
	for i := 1; i <= 170; i++ {
		now := at(5*time.Minute + time.Duration(i)*10*time.Second)
		if due, _ := m.sample(ctx, now, s.PreparedClaims(), nil); len(due) != 0 {
			t.Fatalf("unchanged use was due at %v: %v", now.Sub(t0), due)
		}
	}
	if due, _ := m.sample(ctx, at(35*time.Minute), s.PreparedClaims(), nil); len(due) != 2 {
		t.Fatalf("at the heartbeat: due %v; want both", due)
	}
	m.published(m.summaries(string(a.UID), at(35*time.Minute)), at(35*time.Minute))
	report(inA, 9, 30)
	for i := 1; i < 30; i++ {
		if due, _ := m.sample(ctx, at(35*time.Minute+time.Duration(i)*10*time.Second), s.PreparedClaims(), nil); len(due) != 1 || due[0] != string(b.UID) {
			t.Fatalf("a grew within the interval: due %v; want only b's heartbeat", due)
		}
	}
	if due, _ := m.sample(ctx, at(40*time.Minute), s.PreparedClaims(), nil); len(due) != 2 {
		t.Fatalf("a grew: due %v at the interval; want a (and b still)", due)
	}
	if u := m.summaries(string(a.UID), at(40*time.Minute))[ka]; u.MemoryMaxBytes != 10<<30 {
		t.Fatalf("after growing: %+v; want a 10Gi peak", u)
	}

	// A released claim is forgotten.
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	m.sample(ctx, at(41*time.Minute), s.PreparedClaims(), nil)
	if len(m.lastPublished(string(a.UID))) != 0 {
		t.Fatal("a released claim's usage is kept")
	}
}

func underscores(uid string) string {
	out := []byte(uid)
	for i := range out {
		if out[i] == '-' {
			out[i] = '_'
		}
	}
	return string(out)
}

func statusUsage(t *testing.T, client *k8sfake.Clientset, claim *resourceapi.ResourceClaim) *configapi.ShareUsage {
	t.Helper()
	got, err := client.ResourceV1().ResourceClaims(claim.Namespace).Get(context.Background(), claim.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 {
		t.Fatalf("status.devices %+v; want the one share", got.Status.Devices)
	}
	var data configapi.DeviceStatusData
	if err := json.Unmarshal(got.Status.Devices[0].Data.Raw, &data); err != nil {
		t.Fatal(err)
	}
	return data.Usage
}

// The driver's loop samples, reports a due claim into its status and serves the metrics.
func TestWatchUsagePublishes(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, a, []checkpoint.PodRef{{UID: podA, Name: "pa"}}); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	pid := livePID(t)
	fakeProc(t, proc, pid, "0::/kubepods/besteffort/pod"+podA+"/c\n")
	if err := fake.ReportUsage(e.cfg.DevRoot, 0, pid, 2<<30, 20, 0); err != nil {
		t.Fatal(err)
	}
	client := k8sfake.NewClientset(a.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry()),
		usage: newUsageMeter(e.backend(), proc, 100*time.Millisecond, time.Hour)}
	go d.watchUsage(ctx, 20*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if u := statusUsageOrNil(client, a); u != nil {
			if u.MemoryMaxBytes != 2<<30 || u.Samples < 2 {
				t.Fatalf("usage %+v; want 2Gi over several samples", u)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no usage in the claim's status within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := testutil.ToFloat64(d.metrics.claimUsed.WithLabelValues("ns", "a", "gpu-0")); got != 2<<30 {
		t.Errorf("fgpu_claim_memory_used_bytes = %v; want 2Gi", got)
	}
}

func statusUsageOrNil(client *k8sfake.Clientset, claim *resourceapi.ResourceClaim) *configapi.ShareUsage {
	got, err := client.ResourceV1().ResourceClaims(claim.Namespace).Get(context.Background(), claim.Name, metav1.GetOptions{})
	if err != nil || len(got.Status.Devices) != 1 {
		return nil
	}
	var data configapi.DeviceStatusData
	if json.Unmarshal(got.Status.Devices[0].Data.Raw, &data) != nil {
		return nil
	}
	return data.Usage
}

// While a claim's status writes keep failing, its window stays bounded and its summary still
// counts every sample and the peak.
func TestUsageWindowStaysBoundedWhileReportsFail(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, a, []checkpoint.PodRef{{UID: podA, Name: "pa"}}); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	pid := livePID(t)
	fakeProc(t, proc, pid, "0::/kubepods/burstable/pod"+podA+"/c1\n")
	m := newUsageMeter(e.backend(), proc, 5*time.Minute, 30*time.Minute)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const polls = 3 * maxWindowSamples
	for i := range polls {
		gib := int64(1)
		if i == 100 {
			gib = 9 // one spike, long before the write that succeeds
		}
		if err := fake.ReportUsage(e.cfg.DevRoot, 0, pid, gib<<30, 20, 0); err != nil {
			t.Fatal(err)
		}
		m.sample(ctx, t0.Add(time.Duration(i)*10*time.Second), s.PreparedClaims(), nil)
	}
	k := shareKey{string(a.UID), "gpu", "gpu-0"}
	if n := m.shares[k].window.Len(); n > maxWindowSamples {
		t.Fatalf("%d samples kept after %d polls with no report written; want at most %d", n, polls, maxWindowSamples)
	}
	if u := m.summaries(string(a.UID), t0.Add(polls*10*time.Second))[k]; u.Samples != polls || u.MemoryMaxBytes != 9<<30 {
		t.Fatalf("summary %+v; want all %d samples and the 9Gi spike", u, polls)
	}
}
