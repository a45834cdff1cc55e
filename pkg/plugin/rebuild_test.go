package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

func reserved(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: c.Name + "-pod", UID: c.UID + "-pod"}}
	return c
}

func events(t *testing.T, e *env) []corev1.Event {
	t.Helper()
	list, err := e.client.CoreV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

func TestCorruptCheckpointIsRebuiltFromTheNodeAndTheAPI(t *testing.T) {
	for name, corrupt := range map[string]func(*testing.T, []byte) []byte{
		"truncated": func(_ *testing.T, raw []byte) []byte { return raw[:len(raw)/2] },
		"garbage":   func(*testing.T, []byte) []byte { return []byte("\x00\xffgarbage") },
		"wrong version": func(t *testing.T, _ []byte) []byte {
			dir := t.TempDir()
			cp := checkpoint.New()
			cp.Version = "fgpu.dev/checkpoint/v0"
			if err := checkpoint.NewStore(filepath.Join(dir, "c")).Save(cp); err != nil {
				t.Fatal(err)
			}
			raw, _ := os.ReadFile(filepath.Join(dir, "c"))
			return raw
		},
	} {
		t.Run(name, func(t *testing.T) { testRebuild(t, corrupt) })
	}
}

func testRebuild(t *testing.T, corrupt func(*testing.T, []byte) []byte) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := reserved(builders.MakeClaim("ns", "a").Memory("10Gi").Compute("20").Created(1).AllocatedOn(node, "gpu-0").Obj())
	b := reserved(builders.MakeClaim("ns", "b").Memory("20Gi").Config(map[string]any{"isolationDomain": "other"}).Created(2).AllocatedOn(node, "gpu-0").Obj())
	c := reserved(builders.MakeClaim("ns", "c").Memory("10Gi").Created(3).AllocatedOn(node, "gpu-1").Obj())
	// gone's pod has ended but the kubelet's unprepare was lost with the checkpoint.
	gone := builders.MakeClaim("ns", "gone").Memory("10Gi").Config(map[string]any{"isolationDomain": "gone"}).Created(4).AllocatedOn(node, "gpu-1").Obj()
	// later is reserved but was never prepared here: the kubelet prepares it.
	later := reserved(builders.MakeClaim("ns", "later").Memory("10Gi").Created(5).AllocatedOn(node, "gpu-1").Obj())
	for _, claim := range []*resourceapi.ResourceClaim{a, b, c, gone} {
		if _, err := s.Prepare(ctx, claim); err != nil {
			t.Fatal(err)
		}
	}
	before := s.PreparedClaims()
	keysBefore, _ := s.daemons.mps.Keys(context.Background())
	e.client = fake.NewClientset(a, b, c, gone, later)

	path := e.cfg.CheckpointPath()
	raw, _ := os.ReadFile(path)
	if err := os.WriteFile(path, corrupt(t, raw), 0o600); err != nil {
		t.Fatal(err)
	}
	restarted := e.state()

	claims := restarted.PreparedClaims()
	if len(claims) != 3 {
		t.Fatalf("want a, b and c taken back, have %+v", claims)
	}
	for _, claim := range []*resourceapi.ResourceClaim{a, b, c} {
		got, want := claims[string(claim.UID)], before[string(claim.UID)]
		if got.State != checkpoint.PrepareCompleted || !devicesEqual(got.Devices, want.Devices) {
			t.Errorf("claim %s rebuilt as %+v, was %+v", claim.Name, got, want)
		}
	}
	uids, _ := restarted.cdi.ClaimUIDs()
	slices.Sort(uids)
	wantUIDs := []string{string(a.UID), string(b.UID), string(c.UID)}
	slices.Sort(wantUIDs)
	if !slices.Equal(uids, wantUIDs) {
		t.Fatalf("CDI specs after rebuild %v, want %v", uids, wantUIDs)
	}
	keys, _ := restarted.daemons.mps.Keys(context.Background())
	if len(keysBefore) != 4 || len(keys) != 3 {
		t.Fatalf("MPS servers before %v, after %v: want gone's server stopped, the others kept", keysBefore, keys)
	}
	for _, k := range keys {
		if !restarted.daemons.mps.Running(ctx, k) {
			t.Errorf("server %s not running", k)
		}
	}
	if _, err := restarted.Prepare(ctx, later); err != nil {
		t.Fatalf("the claim the kubelet prepares next: %v", err)
	}
	aside, _ := filepath.Glob(path + ".corrupt-*")
	if len(aside) != 1 {
		t.Fatalf("corrupt checkpoint copied to %v", aside)
	}
	evs := events(t, e)
	if len(evs) != 1 || evs[0].Reason != ReasonCheckpointRecovered || evs[0].InvolvedObject.Kind != "Node" || evs[0].InvolvedObject.Name != node ||
		evs[0].Type != corev1.EventTypeWarning || !strings.Contains(evs[0].Message, "took back 3 claim(s) [ns/a, ns/b, ns/c]") ||
		!strings.Contains(evs[0].Message, "ns/gone (no longer reserved for a pod)") || !strings.Contains(evs[0].Message, aside[0]) {
		t.Fatalf("events: %+v", evs)
	}

	again := e.state()
	if got := again.PreparedClaims(); len(got) != 4 {
		t.Fatalf("second start has %d claims, want a, b, c and later", len(got))
	}
	if evs := events(t, e); len(evs) != 1 {
		t.Fatalf("second start recorded events: %+v", evs)
	}
}

func devicesEqual(a, b []checkpoint.PreparedDevice) bool {
	return slices.EqualFunc(a, b, func(x, y checkpoint.PreparedDevice) bool {
		return x.GPUUUID == y.GPUUUID && x.Device == y.Device && x.ShareID == y.ShareID && x.MemoryBytes == y.MemoryBytes &&
			x.ComputePercent == y.ComputePercent && x.MemoryLimitBytes == y.MemoryLimitBytes && x.ThreadPercent == y.ThreadPercent &&
			x.Mode == y.Mode && x.MPSKey == y.MPSKey && x.IsolationDomain == y.IsolationDomain && slices.Equal(x.CDIDeviceIDs, y.CDIDeviceIDs)
	})
}

func TestRebuildNeverOverCommits(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	first := reserved(builders.MakeClaim("ns", "first").Memory("50Gi").Created(1).AllocatedOn(node, "gpu-0").Obj())
	second := reserved(builders.MakeClaim("ns", "second").Memory("50Gi").Created(2).AllocatedOn(node, "gpu-0").Obj())
	if _, err := s.Prepare(ctx, first); err != nil {
		t.Fatal(err)
	}
	// A spec for second, as if an earlier checkpoint had lost first.
	planned, err := s.planner.plan(second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cdi.Write(string(second.UID), []cdi.Device{s.cdi.device(&planned[0], 0, 1)}); err != nil {
		t.Fatal(err)
	}
	e.client = fake.NewClientset(second, first)
	if err := os.WriteFile(e.cfg.CheckpointPath(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	restarted := e.state()
	claims := restarted.PreparedClaims()
	if _, ok := claims[string(first.UID)]; len(claims) != 1 || !ok {
		t.Fatalf("want only the older claim taken back, have %+v", claims)
	}
	if uids, _ := restarted.cdi.ClaimUIDs(); !slices.Equal(uids, []string{string(first.UID)}) {
		t.Fatalf("specs %v", uids)
	}
	if evs := events(t, e); len(evs) != 1 || !strings.Contains(evs[0].Message, "ns/second (refusing to over-commit GPU gpu-0") {
		t.Fatalf("events: %+v", evs)
	}
}

func TestCorruptCheckpointWithoutAnAPIStopsTheStart(t *testing.T) {
	e := newEnv(t)
	if err := os.MkdirAll(e.cfg.PluginDataDir, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(e.cfg.CheckpointPath(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := e.backend()
	if _, err := NewState(context.Background(), e.cfg, b, nil); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("want the start refused, got %v", err)
	}
	if _, err := os.Stat(e.cfg.CheckpointPath()); err != nil {
		t.Fatalf("the checkpoint must stay for a post-mortem: %v", err)
	}
}

// A rebuilt checkpoint keeps refusing what the lost one refused: the refusals of claims the
// allocator places again come back from the Prepared=False conditions on their shares. A
// condition on a share of an earlier allocation, or on a claim nothing places again, does
// not.
func TestRebuildKeepsRefusals(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := byAllocator(builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj())
	c := builders.MakeClaim("ns", "c").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	client := fake.NewClientset(b.DeepCopy(), c.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b, c})
	if res[b.UID].Err == nil || res[c.UID].Err == nil {
		t.Fatal("over-commit prepared")
	}
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	var claims []runtime.Object
	var refusedB *resourceapi.ResourceClaim
	for _, name := range []string{"b", "c"} {
		got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(got.Status.Devices) != 1 {
			t.Fatalf("claim %s: %v %+v", name, err, got)
		}
		claims = append(claims, got)
		if name == "b" {
			refusedB = got
		}
	}
	// moved was refused on an earlier share of gpu-0 and has been placed again since.
	moved := refusedB.DeepCopy()
	moved.Name, moved.UID = "moved", "uid-moved"
	moved.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("00000000-0000-4000-8000-0000000000dd"))
	e.client = fake.NewClientset(append(claims, moved)...)
	if err := os.WriteFile(e.cfg.CheckpointPath(), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	restarted := e.state()
	_, err := restarted.Prepare(ctx, b)
	var rf *refusal
	if !errors.As(err, &rf) || rf.reason != configapi.PrepareReasonOverCommitted || !strings.Contains(err.Error(), "refusing to over-commit GPU gpu-0") {
		t.Fatalf("the refused allocation was prepared after the rebuild: %v", err)
	}
	for _, claim := range []*resourceapi.ResourceClaim{c, moved} {
		if _, err := restarted.Prepare(ctx, claim); err != nil {
			t.Errorf("claim %s: %v", claim.Name, err)
		}
	}
	if evs := events(t, e); len(evs) != 1 || !strings.Contains(evs[0].Message, "; still refused (their refusal stands on the claim until the allocator places them again): ns/b") {
		t.Fatalf("events: %+v", evs)
	}
}
