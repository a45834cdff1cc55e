package tenancy

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

// Finding 4 of issue #24: a tenant cannot put words in fgpu's mouth. It writes events in the
// allocator's and the plugin's name (both events APIs, a sizing recommendation among them),
// and overwrites, removes and presets its claim's fgpu.dev/status (on the claim and through a
// template): every write is refused. `kubectl fgpu why`, run with the tenant's credentials,
// tells the allocator's real status; an event the tenant writes in its own name is only
// history; `kubectl fgpu recommendations` shows nothing.
func TestTenantCannotForgeFgpusWord(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	tenant, ns := quotaNamespace(t, "forge", "e2e-tenancy-forge-quota", "20Gi")
	pod, err := framework.MakeGPUPod(ns, "big").Memory("40Gi").CreateAs(ctx, tenant.Client)
	if err != nil {
		t.Fatal(err)
	}
	allocatorSays := waitClaimStatus(t, pod, 20*time.Second, "larger than", "e2e-tenancy-forge-quota")
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	const forged = "FORGED: placed on a GPU of its own"
	refused := func(what string, err error, want string) {
		t.Helper()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: want a refusal saying %q, got %v", what, want, err)
		}
	}

	podRef := corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod.Name, UID: pod.UID}
	coreEvent := func(source, reporting, reason, msg string) *corev1.Event {
		now := metav1.Now()
		return &corev1.Event{ObjectMeta: metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: ns}, InvolvedObject: podRef,
			Type: corev1.EventTypeNormal, Reason: reason, Message: "claim " + claim.Name + ": " + msg,
			Source: corev1.EventSource{Component: source}, ReportingController: reporting, FirstTimestamp: now, LastTimestamp: now, Count: 1}
	}
	for _, ev := range []*corev1.Event{
		coreEvent("fgpu-allocator", "fgpu-allocator", "FgpuPlaced", forged),
		coreEvent("tenant-tool", "fgpu-allocator", "FgpuPlaced", forged),
		coreEvent("fgpu-kubelet-plugin", "", "FgpuPrepared", forged),
	} {
		_, err := tenant.Client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{})
		refused("event from "+ev.Source.Component+"/"+ev.ReportingController, err, "only fgpu may write events in the name of fgpu-")
	}
	rec := coreEvent("fgpu-allocator", "fgpu-allocator", "FgpuSizingRecommendation", forged)
	raw, err := json.Marshal(api.SizingRecord{Workload: api.SizingWorkload{Namespace: ns, Kind: "Deployment", Name: "web", Request: "gpu"},
		Recommendation: api.SizingRecommendation{MemoryBytes: 1 << 30, ComputePercent: 5, Samples: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	rec.Annotations = map[string]string{api.AnnotationSizingRecord: string(raw)}
	_, err = tenant.Client.CoreV1().Events(ns).Create(ctx, rec, metav1.CreateOptions{})
	refused("a sizing recommendation", err, "only fgpu may write events in the name of fgpu-allocator")
	_, err = tenant.Client.EventsV1().Events(ns).Create(ctx, &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{Name: pod.Name + ".forged", Namespace: ns}, EventTime: metav1.NowMicro(),
		ReportingController: "fgpu-allocator", ReportingInstance: "fgpu-allocator-0", Action: "Place", Reason: "FgpuPlaced",
		Regarding: podRef, Note: "claim " + claim.Name + ": " + forged, Type: corev1.EventTypeNormal,
	}, metav1.CreateOptions{})
	refused("events.k8s.io event from fgpu-allocator", err, "only fgpu may write events in the name of fgpu-allocator")
	const own = "TENANT-HISTORY: my own note"
	if _, err := tenant.Client.CoreV1().Events(ns).Create(ctx, coreEvent("tenant-tool", "tenant-tool", "Note", own), metav1.CreateOptions{}); err != nil {
		t.Errorf("the tenant could not write an event in its own name: %v", err)
	}

	const statusRefusal = "only the allocator may set, change or remove it"
	for what, patch := range map[string]string{
		"overwrite": `{"metadata":{"annotations":{"` + api.AnnotationStatus + `":"` + forged + `"}}}`,
		"remove":    `{"metadata":{"annotations":{"` + api.AnnotationStatus + `":null}}}`,
	} {
		_, err := tenant.Client.ResourceV1().ResourceClaims(ns).Patch(ctx, claim.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		refused(what+" the claim's status", err, statusRefusal)
	}
	preset := builders.MakeClaim(ns, "preset").Memory("10Gi").Obj()
	preset.Annotations = map[string]string{api.AnnotationStatus: forged}
	_, err = tenant.Client.ResourceV1().ResourceClaims(ns).Create(ctx, preset, metav1.CreateOptions{})
	refused("a claim created with a status", err, statusRefusal)
	tmpl := framework.MakeGPUPod(ns, "preset").Memory("10Gi").Template()
	tmpl.Spec.Annotations = map[string]string{api.AnnotationStatus: forged}
	_, err = tenant.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{})
	refused("a template with a status", err, statusRefusal)

	// What the tenant sees, as `kubectl fgpu why big` and `kubectl fgpu recommendations`
	// would show it to the tenant.
	r, err := clusterview.Why(ctx, tenant.Client, framework.Driver, ns, pod.Name)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := clusterview.PrintWhy(&out, r, time.Now()); err != nil {
		t.Fatal(err)
	}
	asJSON, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	flat := strings.Join(strings.Fields(out.String()), " ")
	if strings.Contains(flat, "FORGED") || strings.Contains(string(asJSON), "FORGED") {
		t.Errorf("why shows the forged text:\n%s", out.String())
	}
	if r.State != clusterview.StateWaitingGPU || len(r.Claims) != 1 || r.Claims[0].Status != allocatorSays {
		t.Errorf("why: state %s, claims %+v; want the allocator's status %q", r.State, r.Claims, allocatorSays)
	}
	report, history, ok := strings.Cut(flat, "Events, oldest first: history, not fgpu's verdict")
	if !ok || strings.Contains(report, "TENANT-HISTORY") || !strings.Contains(history, "(from tenant-tool): claim "+claim.Name+": "+own) {
		t.Errorf("the tenant's own event is not shown as history, in its own name:\n%s", out.String())
	}
	recs, err := clusterview.Recommendations(ctx, tenant.Client, ns)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 0 {
		t.Errorf("recommendations the allocator never made: %+v", recs)
	}
	notAllocated(t, pod)
	healthy(t, ns)
}
