package plugin

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// namingClient is a fake clientset that names events from their generateName, as the API
// server does.
func namingClient() *k8sfake.Clientset {
	client := k8sfake.NewClientset()
	var mu sync.Mutex
	n := 0
	client.PrependReactor("create", "events", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if ev, ok := a.(k8stesting.CreateAction).GetObject().(*corev1.Event); ok {
			mu.Lock()
			n++
			ev.Name = fmt.Sprintf("%s%d", ev.GenerateName, n)
			mu.Unlock()
		}
		return false, nil, nil
	})
	return client
}

func (e *env) inject(index int, line string) {
	e.t.Helper()
	if err := fake.InjectFault(e.cfg.DevRoot, index, line); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) recoverGPU(index int) {
	e.t.Helper()
	if err := fake.RemoveFaults(e.cfg.DevRoot, index); err != nil {
		e.t.Fatal(err)
	}
}

// published is what the driver would publish: the devices with their taints.
func published(d *Driver) []resourceapi.Device {
	faults := map[string][]resourceapi.DeviceTaint{}
	for _, g := range d.state.Devices() {
		faults[g.Name()] = d.health.taints(g.UUID)
	}
	return DriverResources(node, d.state.Devices(), d.cfg.ReservedMemory, d.cfg.Fenced, d.state.Foreign(), faults, nil).Pools[node].Slices[0].Devices
}

func (e *env) driver(s *State, backend gpu.Backend) *Driver {
	return &Driver{state: s, client: e.client, cfg: e.cfg, health: newHealth(context.Background(), e.cfg, backend, s.Devices())}
}

func taintStrings(ts []resourceapi.DeviceTaint) []string {
	var out []string
	for _, t := range ts {
		out = append(out, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	return out
}

// A fatal fault taints its GPU NoExecute, a degraded one NoSchedule; both go when the
// condition clears, without a restart, each change with a Node event.
func TestFaultTaintsComeAndGo(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	d := e.driver(s, e.backend())
	if c := d.health.refresh(ctx); len(c) != 0 {
		t.Fatalf("healthy GPUs changed: %+v", c)
	}
	e.inject(1, "xid 79")
	e.inject(0, "row-remap-failure")
	d.reportHealth(ctx, d.health.refresh(ctx))
	res := published(d)
	if got := taintStrings(taints(res, "gpu-1")); !slices.Equal(got, []string{"fgpu.dev/allocator=required:NoSchedule", "fgpu.dev/gpu-fault=xid-79:NoExecute"}) {
		t.Errorf("gpu-1 taints %v", got)
	}
	if ts := taints(res, "gpu-1"); len(ts) == 2 && ts[1].TimeAdded == nil {
		t.Error("a fault taint has no time")
	}
	if got := taintStrings(taints(res, "gpu-0")); !slices.Equal(got, []string{"fgpu.dev/allocator=required:NoSchedule", "fgpu.dev/gpu-degraded=row-remap-failure:NoSchedule"}) {
		t.Errorf("gpu-0 taints %v", got)
	}
	// Nothing changed: no news, and the taints keep their time.
	before := taints(published(d), "gpu-1")[1].TimeAdded
	if c := d.health.refresh(ctx); len(c) != 0 {
		t.Errorf("unchanged faults reported: %+v", c)
	}
	if after := taints(published(d), "gpu-1")[1].TimeAdded; !after.Equal(before) {
		t.Errorf("taint time moved from %v to %v", before, after)
	}
	e.recoverGPU(1)
	e.recoverGPU(0)
	d.reportHealth(ctx, d.health.refresh(ctx))
	res = published(d)
	for _, name := range []string{"gpu-0", "gpu-1"} {
		if got := taintStrings(taints(res, name)); !slices.Equal(got, []string{"fgpu.dev/allocator=required:NoSchedule"}) {
			t.Errorf("%s after recovery: %v", name, got)
		}
	}
	evs := events(t, e)
	var reasons []string
	for _, ev := range evs {
		reasons = append(reasons, ev.Reason+"/"+ev.Type)
		if ev.Reason == ReasonGPUFault && strings.Contains(ev.Message, "gpu-1") &&
			(!strings.Contains(ev.Message, "fgpu.dev/gpu-fault=xid-79:NoExecute") || !strings.Contains(ev.Message, "evicted")) {
			t.Errorf("fault event says %q", ev.Message)
		}
	}
	slices.Sort(reasons)
	if want := []string{"FgpuGPUFault/Warning", "FgpuGPUFault/Warning", "FgpuGPURecovered/Normal", "FgpuGPURecovered/Normal"}; !slices.Equal(reasons, want) {
		t.Errorf("events %v, want %v", reasons, want)
	}
}

// An XID is the GPU's only where its driver says the GPU needs a recovery action: one that
// a tenant provokes in its own context (a bad kernel, a killed channel) taints nothing, also
// outside the few XIDs the catalog names; where the driver asks for a reset, the GPU is
// fenced whatever the XID.
func TestOneContextsXIDTaintsNoGPU(t *testing.T) {
	e := newEnv(t)
	e.client = namingClient()
	s := e.state()
	ctx := context.Background()
	d := e.driver(s, e.backend())
	e.inject(0, "xid 69 graphics engine class error of a tenant's kernel")
	e.inject(0, "xid 31")
	e.inject(0, "xid 79 action=none")
	e.inject(1, "xid 13 action=gpu-reset")
	d.reportHealth(ctx, d.health.refresh(ctx))
	res := published(d)
	if got := taints(res, "gpu-0"); len(got) != 0 {
		t.Errorf("one context's faults taint gpu-0: %v", taintStrings(got))
	}
	if got := taintStrings(taints(res, "gpu-1")); !slices.Equal(got, []string{"fgpu.dev/gpu-fault=xid-13:NoExecute"}) {
		t.Errorf("gpu-1, whose driver asks for a reset: %v", got)
	}
	if r := d.health.report(); r.Devices[0].Health != kubeletplugin.HealthStatusHealthy {
		t.Errorf("the kubelet is told gpu-0 is %s: %s", r.Devices[0].Health, r.Devices[0].Message)
	}
	for _, ev := range events(t, e) {
		if strings.Contains(ev.Message, "gpu-0") {
			t.Errorf("an event about gpu-0: %s", ev.Message)
		}
	}
}

// stubMonitor stands for NVML: latched events it forgets on a restart, and conditions.
type stubMonitor struct {
	gpu.Backend
	mu      sync.Mutex
	faults  map[string][]gpu.Fault
	cleared []string
}

func (m *stubMonitor) Faults() (map[string][]gpu.Fault, map[string]error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string][]gpu.Fault{}
	for k, v := range m.faults {
		out[k] = slices.Clone(v)
	}
	return out, nil
}

func (m *stubMonitor) ClearFaults(uuid string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cleared = append(m.cleared, uuid)
	delete(m.faults, uuid)
	return nil
}

// A restart keeps the latched faults (an event is not seen again) and drops conditions that
// went; an admin's clear request drops the latched ones.
func TestRestartKeepsLatchedFaultsUntilAnAdminClears(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	devs := s.Devices()
	mon := &stubMonitor{Backend: e.backend(), faults: map[string][]gpu.Fault{
		devs[0].UUID: {{Kind: gpu.FaultXID, XID: 48, Latched: true, Since: time.Now()}},
		devs[1].UUID: {{Kind: gpu.FaultPower, Since: time.Now()}},
	}}
	d := e.driver(s, mon)
	d.health.refresh(ctx)
	if got := taintStrings(d.health.taints(devs[0].UUID)); !slices.Equal(got, []string{"fgpu.dev/gpu-fault=xid-48:NoExecute"}) {
		t.Fatalf("gpu-0: %v", got)
	}

	// Restart: the new backend remembers no event, and the power brake is over.
	mon2 := &stubMonitor{Backend: e.backend(), faults: map[string][]gpu.Fault{}}
	d2 := e.driver(s, mon2)
	d2.health.refresh(ctx)
	if got := taintStrings(d2.health.taints(devs[0].UUID)); !slices.Equal(got, []string{"fgpu.dev/gpu-fault=xid-48:NoExecute"}) {
		t.Errorf("gpu-0 after a restart: %v", got)
	}
	if got := d2.health.taints(devs[1].UUID); len(got) != 0 {
		t.Errorf("gpu-1 after a restart: %v", taintStrings(got))
	}

	if err := os.MkdirAll(ClearFaultsDir(e.cfg.PluginDataDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ClearFaultsDir(e.cfg.PluginDataDir)+"/gpu-0", nil, 0o644); err != nil {
		t.Fatal(err)
	}
	changes := d2.health.refresh(ctx)
	if got := d2.health.taints(devs[0].UUID); len(got) != 0 {
		t.Errorf("gpu-0 after the admin cleared it: %v", taintStrings(got))
	}
	if !slices.Equal(mon2.cleared, []string{devs[0].UUID}) {
		t.Errorf("backend cleared %v", mon2.cleared)
	}
	if len(changes) != 2 || changes[0].Reason != ReasonGPUFaultCleared || changes[1].Reason != ReasonGPURecovered {
		t.Errorf("changes %+v", changes)
	}
	if _, err := os.Stat(ClearFaultsDir(e.cfg.PluginDataDir) + "/gpu-0"); !os.IsNotExist(err) {
		t.Errorf("the clear request is still there: %v", err)
	}
	d3 := e.driver(s, &stubMonitor{Backend: e.backend()})
	d3.health.refresh(ctx)
	if got := d3.health.taints(devs[0].UUID); len(got) != 0 {
		t.Errorf("a cleared fault came back after a restart: %v", taintStrings(got))
	}
}

// A GPU that faults FlapCount times within FlapWindow stays fenced for FlapBackoff, also
// across a restart, with an event saying why.
func TestFlappingGPUStaysFencedForTheBackoff(t *testing.T) {
	e := newEnv(t)
	e.cfg.FlapCount, e.cfg.FlapWindow, e.cfg.FlapBackoff = 3, time.Minute, 10*time.Minute
	s := e.state()
	ctx := context.Background()
	uuid := s.Devices()[0].UUID
	clock := time.Now()
	newDriver := func() *Driver {
		d := e.driver(s, e.backend())
		d.health.now = func() time.Time { return clock }
		return d
	}
	d := newDriver()
	var flapping []HealthChange
	for i := range 3 {
		e.inject(0, "xid 92")
		d.health.refresh(ctx)
		clock = clock.Add(10 * time.Second)
		e.recoverGPU(0)
		for _, c := range d.health.refresh(ctx) {
			if c.Reason == ReasonGPUFlapping {
				flapping = append(flapping, c)
			}
		}
		if got := d.health.taints(uuid); (i < 2) != (len(got) == 0) {
			t.Fatalf("after fault %d cleared: %v", i+1, taintStrings(got))
		}
		clock = clock.Add(10 * time.Second)
	}
	if got := taintStrings(d.health.taints(uuid)); !slices.Equal(got, []string{"fgpu.dev/gpu-flapping=backoff:NoSchedule"}) {
		t.Fatalf("after 3 faults: %v", got)
	}
	// The third onset is when the back-off starts; its event came with the fault.
	if len(flapping) != 0 {
		t.Errorf("flapping reported when the fault cleared: %+v", flapping)
	}
	if r := d.health.report(); r.Devices[0].Health != kubeletplugin.HealthStatusHealthy || !strings.Contains(r.Devices[0].Message, "fenced after repeated faults") {
		t.Errorf("kubelet report %+v", r.Devices[0])
	}
	d = newDriver()
	d.health.refresh(ctx)
	if got := d.health.taints(uuid); len(got) != 1 {
		t.Fatalf("a restart dropped the back-off: %v", taintStrings(got))
	}
	clock = clock.Add(10 * time.Minute)
	changes := d.health.refresh(ctx)
	if got := d.health.taints(uuid); len(got) != 0 {
		t.Fatalf("after the back-off: %v", taintStrings(got))
	}
	if len(changes) != 1 || changes[0].Reason != ReasonGPURecovered {
		t.Errorf("changes %+v", changes)
	}
}

func TestFlappingEventSaysWhy(t *testing.T) {
	e := newEnv(t)
	e.cfg.FlapCount = 2
	s := e.state()
	ctx := context.Background()
	d := e.driver(s, e.backend())
	e.inject(0, "lost")
	d.health.refresh(ctx)
	e.recoverGPU(0)
	d.health.refresh(ctx)
	e.inject(0, "lost")
	changes := d.health.refresh(ctx)
	i := slices.IndexFunc(changes, func(c HealthChange) bool { return c.Reason == ReasonGPUFlapping })
	if i < 0 || !strings.Contains(changes[i].Message, "faulted 2 times within 10m0s") || !strings.Contains(changes[i].Message, configapi.FlappingTaintKey) {
		t.Fatalf("changes %+v", changes)
	}
	if got := taintStrings(d.health.taints(s.Devices()[0].UUID)); !slices.Equal(got, []string{"fgpu.dev/gpu-fault=lost:NoExecute", "fgpu.dev/gpu-flapping=backoff:NoSchedule"}) {
		t.Errorf("taints %v", got)
	}
}

// The kubelet gets every GPU's health at once, again when one changes.
func TestWatchHealthStatusReportsChanges(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	d := e.driver(s, e.backend())
	ctx, cancel := context.WithCancel(context.Background())
	reports := make(chan kubeletplugin.DeviceHealthReport)
	done := make(chan error)
	go func() { done <- d.WatchHealthStatus(ctx, reports) }()
	first := <-reports
	if len(first.Devices) != 2 || first.Devices[0].Health != kubeletplugin.HealthStatusHealthy || first.Devices[0].PoolName != node {
		t.Fatalf("first report %+v", first)
	}
	e.inject(1, "ecc-dbe")
	d.health.refresh(ctx)
	select {
	case r := <-reports:
		if r.Devices[1].DeviceName != "gpu-1" || r.Devices[1].Health != kubeletplugin.HealthStatusUnhealthy || r.Devices[1].Message != "fatal: ecc-dbe" {
			t.Errorf("report after the fault %+v", r.Devices[1])
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no report after a fault")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("WatchHealthStatus: %v", err)
	}
}
