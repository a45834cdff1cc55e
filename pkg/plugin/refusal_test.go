package plugin

import (
	"context"
	"errors"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// A prepare refused for over-commit is recorded on the claim, where the allocator sees it.
func TestRefusedPrepareRecordedOnClaim(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	b.UID = "uid-b"
	other := resourceapi.AllocatedDeviceStatus{Driver: "other.example.com", Pool: "p", Device: "d"}
	b.Status.Devices = []resourceapi.AllocatedDeviceStatus{other}
	client := k8sfake.NewClientset(b.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b})
	if err != nil || res[b.UID].Err == nil {
		t.Fatalf("prepare of b: %v %v", err, res[b.UID].Err)
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 2 || got.Status.Devices[0].Driver != other.Driver {
		t.Fatalf("status.devices %+v", got.Status.Devices)
	}
	st := got.Status.Devices[1]
	r := b.Status.Allocation.Devices.Results[0]
	if st.Driver != configapi.DriverName || st.Pool != node || st.Device != "gpu-0" || st.ShareID == nil || *st.ShareID != string(*r.ShareID) || len(st.Conditions) != 1 {
		t.Fatalf("entry %+v", st)
	}
	c := st.Conditions[0]
	if c.Type != configapi.DeviceConditionPrepared || c.Status != metav1.ConditionFalse || c.Reason != configapi.PrepareReasonOverCommitted ||
		!strings.Contains(c.Message, "refusing to over-commit GPU gpu-0") || c.LastTransitionTime.IsZero() {
		t.Fatalf("condition %+v", c)
	}
	// A refusal placing again cannot fix (a bad config) is not recorded.
	bad := builders.MakeClaim("ns", "bad").Memory("1Gi").Config(map[string]any{"memoryLimit": "2Gi"}).AllocatedOn(node, "gpu-1").Obj()
	bad.UID = "uid-bad"
	if _, err := client.ResourceV1().ResourceClaims("ns").Create(ctx, bad, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{bad}); res[bad.UID].Err == nil {
		t.Fatal("bad config prepared")
	}
	if got, _ := client.ResourceV1().ResourceClaims("ns").Get(ctx, "bad", metav1.GetOptions{}); len(got.Status.Devices) != 0 {
		t.Fatalf("a config error was reported as placeable again: %+v", got.Status.Devices)
	}
}

// Once refused for a reason the allocator acts on, an allocation stays refused on every
// retry, also after the GPU empties and after a plugin restart: the allocator may read the
// refusal condition late and take the allocation back, so the plugin must never prepare a
// share for it. A new allocation of the claim (another share) is judged afresh.
func TestRefusedAllocationStaysRefused(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := byAllocator(builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj())
	client := k8sfake.NewClientset(b.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b}); res[b.UID].Err == nil {
		t.Fatal("over-commit prepared")
	}
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	refusedAgain := func(s *State, why string) {
		t.Helper()
		_, err := s.Prepare(ctx, b)
		var rf *refusal
		if !errors.As(err, &rf) || rf.reason != configapi.PrepareReasonOverCommitted || !strings.Contains(err.Error(), "refusing to over-commit GPU gpu-0") {
			t.Fatalf("%s: the refused allocation was not refused again: %v", why, err)
		}
		if _, ok := s.PreparedClaims()[string(b.UID)]; ok {
			t.Fatalf("%s: prepared", why)
		}
	}
	refusedAgain(s, "the GPU is empty now")
	// The retry publishes the condition again (an earlier write may have failed).
	if err := client.ResourceV1().ResourceClaims("ns").Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.ResourceV1().ResourceClaims("ns").Create(ctx, b.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b}); res[b.UID].Err == nil {
		t.Fatal("prepared on retry")
	}
	if got, _ := client.ResourceV1().ResourceClaims("ns").Get(ctx, "b", metav1.GetOptions{}); len(got.Status.Devices) != 1 ||
		got.Status.Devices[0].Conditions[0].Reason != configapi.PrepareReasonOverCommitted {
		t.Fatalf("the retry did not record the refusal again: %+v", got.Status.Devices)
	}
	restarted := e.state()
	refusedAgain(restarted, "after a plugin restart")

	// The allocator placed the claim again: same GPU, another share.
	again := b.DeepCopy()
	again.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("00000000-0000-4000-8000-0000000000bb"))
	if _, err := restarted.Prepare(ctx, again); err != nil {
		t.Fatalf("a new allocation must be judged afresh: %v", err)
	}
	if n := len(restarted.cp.Refused); n != 0 {
		t.Errorf("the claim's earlier refusal is kept: %+v", restarted.cp.Refused)
	}
}

// byAllocator marks the claim's allocation as the allocator's (the fence toleration its
// results carry).
func byAllocator(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	for i := range c.Status.Allocation.Devices.Results {
		r := &c.Status.Allocation.Devices.Results[i]
		r.Tolerations = append(r.Tolerations, configapi.FenceToleration())
	}
	return c
}

// In allocator mode, a claim the allocator did not place (kube-scheduler allocated it before
// the switch to allocator mode) is not placed again after a refusal: its refusal is not
// kept, and a retry prepares it once there is room. Its refusal is still recorded on the
// claim, for its owner to read.
func TestRefusalOfAClaimTheAllocatorDidNotPlaceIsNotKept(t *testing.T) {
	e := newEnv(t)
	e.cfg.Fenced = true
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	client := k8sfake.NewClientset(b.DeepCopy())
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b}); res[b.UID].Err == nil {
		t.Fatal("over-commit prepared")
	}
	if got, _ := client.ResourceV1().ResourceClaims("ns").Get(ctx, "b", metav1.GetOptions{}); len(got.Status.Devices) != 1 {
		t.Fatalf("the refusal is not recorded on the claim: %+v", got.Status.Devices)
	}
	if len(s.cp.Refused) != 0 {
		t.Fatalf("the refusal of a claim nothing places again is kept: %+v", s.cp.Refused)
	}
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, b); err != nil {
		t.Fatalf("retry once the GPU has room: %v", err)
	}
}

// In scheduler mode nothing places a refused claim again: a retry prepares it once there is
// room.
func TestSchedulerModeRetriesARefusedPrepare(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, b); err == nil {
		t.Fatal("over-commit prepared")
	}
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, b); err != nil {
		t.Fatalf("retry once the GPU has room: %v", err)
	}
}

// A refusal is recorded on the refused share only: a claim allocated anew on the same device
// (another share ID) by the time the refusal is written gets no stale condition.
func TestRefusalMatchesTheShare(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	current := b.DeepCopy()
	current.Status.Allocation.Devices.Results[0].ShareID = ptr.To(types.UID("00000000-0000-4000-8000-0000000000cc"))
	client := k8sfake.NewClientset(current)
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	err := refused("gpu-0", string(*b.Status.Allocation.Devices.Results[0].ShareID), configapi.PrepareReasonOverCommitted, errors.New("refusing to over-commit GPU gpu-0"))
	if err := d.publishRefusal(ctx, b, err); err != nil {
		t.Fatal(err)
	}
	if got, _ := client.ResourceV1().ResourceClaims("ns").Get(ctx, "b", metav1.GetOptions{}); len(got.Status.Devices) != 0 {
		t.Fatalf("a refusal of the earlier share was recorded on the new one: %+v", got.Status.Devices)
	}
}
