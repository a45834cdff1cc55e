package plugin

import (
	"context"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

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

// A refusal is recorded only on the share the kubelet asked to prepare: a claim allocated
// again since, on the same device with another share ID, is not told the new share was
// refused (the allocator would take back an allocation nothing refused).
func TestRefusalNotRecordedOnLaterShareOfSameDevice(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("60Gi").AllocatedOn(node, "gpu-0").Obj()
	b := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	b.UID = "uid-b"
	again := builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").ShareID("a-later-share").Obj()
	again.UID = b.UID
	client := k8sfake.NewClientset(again)
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	if res, _ := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{b}); res[b.UID].Err == nil {
		t.Fatal("over-committing prepare of b succeeded")
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 0 {
		t.Fatalf("the refusal of the earlier share was recorded on the later one: %+v", got.Status.Devices)
	}
}
