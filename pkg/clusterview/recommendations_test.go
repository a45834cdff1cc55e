package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

func recEvent(t *testing.T, ns, name, component string, at time.Time, w api.SizingWorkload, memGiB int64) *corev1.Event {
	t.Helper()
	raw, err := json.Marshal(api.SizingRecord{Workload: w, Recommendation: api.SizingRecommendation{MemoryBytes: memGiB << 30, ComputePercent: 40, Samples: 400, PeakBytes: (memGiB - 1) << 30}})
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: map[string]string{api.AnnotationSizingRecord: string(raw)}},
		Reason: "FgpuSizingRecommendation", Source: corev1.EventSource{Component: component}, LastTimestamp: metav1.NewTime(at)}
}

func TestRecommendationsKeepsTheNewestPerWorkload(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	web := api.SizingWorkload{Namespace: "a", Kind: "Deployment", Name: "web", Request: "gpu"}
	forged := web
	forged.Namespace = "b" // an event in a claims to be about b's workload
	c := fake.NewClientset(
		recEvent(t, "a", "e1", "fgpu-allocator", t0, web, 10),
		recEvent(t, "a", "e2", "fgpu-allocator", t0.Add(time.Hour), web, 12),
		recEvent(t, "a", "e3", "someone-else", t0.Add(2*time.Hour), web, 99),
		recEvent(t, "a", "e4", "fgpu-allocator", t0.Add(time.Minute), forged, 20),
	)
	recs, err := Recommendations(context.Background(), c, "")
	if err != nil {
		t.Fatal(err)
	}
	// The fake clientset ignores the reason field selector; all events here have it.
	if len(recs) != 1 || recs[0].Recommendation.MemoryBytes != 12<<30 || recs[0].Workload.Namespace != "a" {
		t.Fatalf("recommendations %+v; want a/web at 12Gi only (the newest of the allocator's, in the event's namespace)", recs)
	}
	var out bytes.Buffer
	if err := PrintRecommendations(&out, recs, t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "a          Deployment/web  gpu      12Gi    40%") {
		t.Fatalf("table:\n%s", out.String())
	}
}
