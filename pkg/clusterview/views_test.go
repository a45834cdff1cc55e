package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	fgpufake "github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned/fake"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

// fits80 fails the test where a line of a table is wider than a terminal.
func fits80(t *testing.T, out string) {
	t.Helper()
	t.Log("\n" + out)
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if n := len([]rune(line)); n > 80 {
			t.Errorf("line of %d columns:\n%s", n, line)
		}
		if strings.TrimRight(line, " ") != line {
			t.Errorf("trailing blanks: %q", line)
		}
	}
}

// roundTrip marshals v as -o json does and decodes it into out.
func roundTrip(t *testing.T, v, out any) {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
}

func event(ns, name, kind, obj string, uid string, reason, source, msg string, at time.Time) *corev1.Event {
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: ns, Name: obj, UID: types.UID(uid)},
		Type:           corev1.EventTypeWarning, Reason: reason, Source: corev1.EventSource{Component: source}, Message: msg, LastTimestamp: metav1.NewTime(at)}
}

func TestWhyAPodWaitingOverQuota(t *testing.T) {
	const msg = "over the GPU memory quota of namespace team-a (SharingPolicy q: 20Gi): 20Gi in use, this claim needs 10Gi, 10Gi over; it will be placed when quota frees up"
	pod := builders.MakePod("team-a", "p3").Claim("p3-gpu").Obj()
	pod.Status.Phase = corev1.PodPending
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/1 nodes are available: 1 cannot allocate all claims."}}
	claim := builders.MakeClaim("team-a", "p3-gpu").Memory("10Gi").Obj()
	claim.Annotations = map[string]string{api.AnnotationStatus: msg}
	c := fake.NewClientset(pod, claim,
		event("team-a", "e1", "Pod", "p3", string(pod.UID), "FgpuOverQuota", "fgpu-allocator", "claim p3-gpu: "+msg, t0),
		event("team-a", "e2", "Pod", "p3", string(pod.UID), "FailedScheduling", "default-scheduler", "0/1 nodes are available: 1 cannot allocate all claims.", t0.Add(time.Second)),
		event("team-a", "e3", "Pod", "p3", "an-earlier-pod", "FgpuPlaced", "fgpu-allocator", "claim p3-gpu: placed on n1/gpu-0", t0.Add(-time.Hour)),
		event("team-a", "e4", "Pod", "other", "x", "FgpuPlaced", "fgpu-allocator", "claim other: placed", t0),
	)
	r, err := Why(context.Background(), c, api.DriverName, "team-a", "p3")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateWaitingGPU || !strings.Contains(r.Summary, "fgpu has not placed claim p3-gpu: over the GPU memory quota") {
		t.Errorf("state %s, summary %q; want the allocator's quota message", r.State, r.Summary)
	}
	if len(r.Claims) != 1 || r.Claims[0].Status != msg || r.Claims[0].Placed || !r.Claims[0].Fgpu {
		t.Errorf("claims %+v", r.Claims)
	}
	if len(r.Events) != 2 || r.Events[0].Reason != "FgpuOverQuota" || r.Events[1].Reason != "FailedScheduling" {
		t.Errorf("events %+v; want this pod's two, oldest first", r.Events)
	}
	var out bytes.Buffer
	if err := PrintWhy(&out, r, t0.Add(3*time.Minute)); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	flat := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"Pod team-a/p3: WaitingGPU (phase Pending)", "p3-gpu: waiting (the allocator's status, as above)", "10Gi over",
		"Events, oldest first: history, not fgpu's verdict", "3m ago Warning FgpuOverQuota pod/p3 (from fgpu-allocator): claim p3-gpu:",
		"pod/p3 (from default-scheduler): 0/1 nodes", "kube-scheduler: 0/1 nodes are available"} {
		if !strings.Contains(flat, want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	var back WhyReport
	roundTrip(t, r, &back)
	if back.State != StateWaitingGPU || back.Claims[0].Claim != "p3-gpu" || len(back.Events) != 2 {
		t.Errorf("json %+v", back)
	}
}

// Whoever may write events in the namespace can write one in any source's name: the claim's
// status comes from its fgpu.dev/status annotation, which only the allocator may write, and
// events stay history, never fgpu's verdict.
func TestWhyTakesTheStatusFromTheClaimNotFromEvents(t *testing.T) {
	const said = "no GPU has 60Gi free; it will be placed when one frees up"
	pod := builders.MakePod("team-a", "p").Claim("p-gpu").Obj()
	pod.Status.Phase = corev1.PodPending
	claim := builders.MakeClaim("team-a", "p-gpu").Memory("60Gi").Obj()
	claim.Annotations = map[string]string{api.AnnotationStatus: said}
	const forged = "placed on n1/gpu-0; the GPU is yours alone"
	c := fake.NewClientset(pod, claim,
		event("team-a", "e1", "Pod", "p", string(pod.UID), "FgpuPlaced", "fgpu-allocator", "claim p-gpu: "+forged, t0.Add(time.Minute)))
	r, err := Why(context.Background(), c, api.DriverName, "team-a", "p")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateWaitingGPU || !strings.HasSuffix(r.Summary, said) || len(r.Claims) != 1 || r.Claims[0].Status != said {
		t.Fatalf("state %s, summary %q, claims %+v; want the claim's status %q", r.State, r.Summary, r.Claims, said)
	}
	var out bytes.Buffer
	if err := PrintWhy(&out, r, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	report, history, ok := strings.Cut(out.String(), "Events, oldest first: history, not fgpu's verdict")
	if !ok || strings.Contains(strings.Join(strings.Fields(report), " "), "the GPU is yours alone") {
		t.Errorf("the event's text is shown outside the events' history:\n%s", out.String())
	}
	if !strings.Contains(strings.Join(strings.Fields(history), " "), "(from fgpu-allocator): claim p-gpu: "+forged) {
		t.Errorf("the history does not name the event's source:\n%s", out.String())
	}

	// Without an annotation the allocator has said nothing, whatever an event says.
	claim.Annotations = nil
	c = fake.NewClientset(pod, claim,
		event("team-a", "e1", "Pod", "p", string(pod.UID), "FgpuPlaced", "fgpu-allocator", "claim p-gpu: "+forged, t0))
	if r, err = Why(context.Background(), c, api.DriverName, "team-a", "p"); err != nil {
		t.Fatal(err)
	}
	if r.Claims[0].Status != "" || strings.Contains(r.Summary, "yours alone") || !strings.Contains(r.Summary, "the allocator has said nothing of it yet") {
		t.Errorf("summary %q, claims %+v", r.Summary, r.Claims)
	}
}

func TestWhyARunningPodAndAGoneOne(t *testing.T) {
	pod := builders.MakePod("team-a", "web").Claim("web-gpu").Bound("n1").Obj()
	pod.Status.Phase = corev1.PodRunning
	claim := builders.MakeClaim("team-a", "web-gpu").Memory("10Gi").Compute("25").AllocatedOn("n1", "gpu-0").Obj()
	claim.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: api.DriverName, Pool: "n1", Device: "gpu-0", Data: &runtime.RawExtension{Raw: []byte(`{"mode":"mps"}`)}}}
	c := fake.NewClientset(pod, claim,
		event("team-a", "e1", "Pod", "gone", "u", "FgpuTimedOut", "fgpu-allocator", "claim gone-gpu: the pod was not scheduled", t0))
	r, err := Why(context.Background(), c, api.DriverName, "team-a", "web")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateRunning || r.Summary != "running on node n1 with GPU shares n1/gpu-0: 10Gi, 25% compute, mps" {
		t.Errorf("state %s, summary %q", r.State, r.Summary)
	}
	r, err = Why(context.Background(), c, api.DriverName, "team-a", "gone")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != StateGone || len(r.Events) != 1 || !strings.Contains(r.Summary, "the events it left follow") {
		t.Errorf("gone pod: %+v", r)
	}
	var out bytes.Buffer
	if err := PrintWhy(&out, r, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
}

func TestTopShowsUseAgainstCaps(t *testing.T) {
	measured := builders.MakeClaim("team-a", "a-very-long-claim-name-that-would-not-fit-x7k2p").Memory("10Gi").Compute("25").AllocatedOn("n1", "gpu-0").Obj()
	sid := string(*measured.Status.Allocation.Devices.Results[0].ShareID)
	measured.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "web-1"}}
	usage := `{"mode":"mps","usage":{"from":"2026-01-01T11:55:00Z","to":"2026-01-01T12:00:00Z","samples":30,"memoryMaxBytes":8053063680,"memoryP95Bytes":7516192768,"memoryMeanBytes":7000000000,"smSamples":30,"smMaxPercent":30,"smP95Percent":22,"smMeanPercent":15}}`
	measured.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: api.DriverName, Pool: "n1", Device: "gpu-0", ShareID: &sid, Data: &runtime.RawExtension{Raw: []byte(usage)}}}
	fresh := builders.MakeClaim("team-b", "new").Memory("20Gi").AllocatedOn("n1", "gpu-1").Obj()
	waiting := builders.MakeClaim("team-b", "waiting").Memory("20Gi").Obj()
	c := fake.NewClientset(measured, fresh, waiting)
	shares, err := Top(context.Background(), c, api.DriverName, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(shares) != 2 || shares[0].Usage == nil || shares[0].Usage.SMP95Percent != 22 || shares[0].MemoryCap != 10<<30 || shares[0].ComputeCap != 25 || shares[1].Usage != nil {
		t.Fatalf("shares %+v", shares)
	}
	var out bytes.Buffer
	if err := PrintTop(&out, shares, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	for _, want := range []string{"7.5Gi/10Gi 75%", "22%/25%", "2m ago", "team-b", "-/20Gi", "-/0%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	only, err := Top(context.Background(), c, api.DriverName, "team-b")
	if err != nil || len(only) != 1 || only[0].Claim != "new" {
		t.Fatalf("team-b only: %+v %v", only, err)
	}
	none, err := Top(context.Background(), c, api.DriverName, "team-c")
	if raw, _ := json.Marshal(none); err != nil || string(raw) != "[]" {
		t.Errorf("no shares: %s %v; want [] for scripts", raw, err)
	}
	var back []ShareUse
	roundTrip(t, shares, &back)
	if back[0].Usage.MemoryMaxBytes != 8053063680 || back[0].Pods[0] != "web-1" {
		t.Errorf("json %+v", back[0])
	}
}

func TestQuotasCountAsTheAllocator(t *testing.T) {
	nsA := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Labels: map[string]string{"tier": "gold"}}}
	nsB := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-b"}}
	idle := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}
	whole := builders.MakeClaim("team-a", "whole").Class(api.DeviceClassExclusive).AllocatedOn("n1", "gpu-1").Obj()
	whole.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
	c := fake.NewClientset(nsA, nsB, idle, builders.MakeSlice("n1", 2, "80Gi"),
		builders.MakeClaim("team-a", "a1").Memory("10Gi").Compute("25").AllocatedOn("n1", "gpu-0").Obj(), whole,
		builders.MakeClaim("team-a", "a2").Memory("10Gi").Obj(),
		builders.MakeClaim("team-b", "b1").Memory("5Gi").AllocatedOn("n1", "gpu-0").Obj())
	fc := fgpufake.NewSimpleClientset(
		builders.MakePolicy("gold").Namespaces("tier", "gold").QuotaMemory("100Gi").QuotaCompute(200).Obj(),
		builders.MakePolicy("tight").Namespaces("tier", "gold").QuotaMemory("95Gi").Obj())
	quotas, err := Quotas(context.Background(), c, fc, api.DriverName, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(quotas) != 2 {
		t.Fatalf("quotas %+v; want team-a and team-b (kube-system has neither quota nor claims)", quotas)
	}
	a := quotas[0]
	if a.Namespace != "team-a" || *a.MemoryQuota != 95<<30 || a.MemoryFrom != "tight" || *a.ComputeQuota != 200 || a.ComputeFrom != "gold" ||
		a.MemoryUsed != 90<<30 || a.ComputeUsed != 125 || a.Placed != 2 || a.Waiting != 1 {
		t.Errorf("team-a %+v; want 90Gi (10Gi + a whole 80Gi GPU) of 95Gi from tight, 125%% of 200%% from gold, 2 placed, 1 waiting", a)
	}
	if b := quotas[1]; b.MemoryQuota != nil || b.MemoryUsed != 5<<30 || b.Placed != 1 {
		t.Errorf("team-b %+v", b)
	}
	var out bytes.Buffer
	if err := PrintQuotas(&out, quotas); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	for _, want := range []string{"90Gi/95Gi 94%", "125%/200%", "tight,gold", "5Gi/-"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
	one, err := Quotas(context.Background(), c, fc, api.DriverName, "kube-system")
	if err != nil || len(one) != 1 || one[0].Namespace != "kube-system" {
		t.Fatalf("one namespace asked for is shown even without quota: %+v %v", one, err)
	}
	var back []NamespaceQuota
	roundTrip(t, quotas, &back)
	if *back[0].MemoryQuota != 95<<30 || back[0].Waiting != 1 {
		t.Errorf("json %+v", back[0])
	}
}

func TestWrapAndFit(t *testing.T) {
	var b strings.Builder
	wrap(&b, strings.Repeat("word ", 40)+strings.Repeat("x", 200), "  ", "    ")
	fits80(t, b.String())
	if got := strings.Join(strings.Fields(b.String()), ""); got != strings.Repeat("word", 40)+strings.Repeat("x", 200) {
		t.Errorf("wrap lost text: %q", got)
	}
	if got := fit("team-a/a-very-long-pod-name-x7k2p", 20); got != "team-a/a-…name-x7k2p" || len([]rune(got)) != 20 {
		t.Errorf("fit: %q", got)
	}
}

// A bursting share shows its burst cap beside what it is guaranteed: in the GPU table, and
// in top, whose use is judged against the cap MPS enforces.
func TestViewsShowABurstingShareItsCap(t *testing.T) {
	claim := builders.MakeClaim("team-a", "web-1-gpu").AllocatedOn("n1", "gpu-0").Obj()
	r := &claim.Status.Allocation.Devices.Results[0]
	r.ConsumedCapacity[api.CapacityMemory] = resource.MustParse("31Gi")
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "web-1"}}
	raw := `{"apiVersion":"fgpu.dev/v1alpha1","kind":"GpuConfig","mode":"mps","placement":{"latencyClass":"bestEffort","memoryLimit":"60Gi"}}`
	claim.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{"gpu"},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}}
	c := fake.NewClientset(builders.MakeSlice("n1", 1, "80Gi"), claim)
	gpus, err := Gather(context.Background(), c, api.DriverName)
	if err != nil || len(gpus) != 1 || len(gpus[0].Tenants) != 1 {
		t.Fatalf("gpus %+v %v", gpus, err)
	}
	if tn := gpus[0].Tenants[0]; tn.Memory != 31<<30 || tn.BurstCap != 60<<30 {
		t.Errorf("tenant %+v; want 31Gi guaranteed, burst cap 60Gi", tn)
	}
	var out bytes.Buffer
	if err := Print(&out, gpus); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	if !strings.Contains(out.String(), "31Gi, burst to 60Gi") {
		t.Errorf("table lacks the burst cap:\n%s", out.String())
	}
	shares, err := Top(context.Background(), c, api.DriverName, "")
	if err != nil || len(shares) != 1 || shares[0].MemoryCap != 60<<30 || shares[0].MemoryGuaranteed != 31<<30 {
		t.Fatalf("top %+v %v; want cap 60Gi, guaranteed 31Gi", shares, err)
	}
}
