package controller

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

func ownedPod(ns, name, kind, owner string, labels map[string]string) *corev1.Pod {
	p := builders.MakePod(ns, name).Claim("c").Bound("n1").Obj()
	p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: owner, Controller: ptr.To(true)}}
	for k, v := range labels {
		p.Labels[k] = v
	}
	return p
}

// usageStatus is the status.devices entry the kubelet plugin writes for the claim's share.
func usageStatus(t *testing.T, claim *resourceapi.ResourceClaim, shareID string, u sizing.Usage) resourceapi.AllocatedDeviceStatus {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"gpuUUID": "GPU-x", "usage": u})
	if err != nil {
		t.Fatal(err)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	return resourceapi.AllocatedDeviceStatus{Driver: api.DriverName, Pool: r.Pool, Device: r.Device, ShareID: &shareID, Data: &runtime.RawExtension{Raw: raw}}
}

func TestRecommendationFromMeasuredUsage(t *testing.T) {
	claim := builders.MakeClaim("team-a", "c").Memory("40Gi").AllocatedOn("n1", "gpu-0").Obj()
	pod := ownedPod("team-a", "web-7c9d5-abcde", "ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"})
	e := newEnvWith(t, func(c *Config) {
		c.Sizing = sizing.DefaultOptions()
		c.Sizing.MinSamples = 90
	}, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), claim, pod)
	share := string(*claim.Status.Allocation.Devices.Results[0].ShareID)
	w := sizing.Workload{Namespace: "team-a", Kind: "Deployment", Name: "web", Request: "gpu"}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	report := func(i int, peakGiB int64, sid string) {
		t.Helper()
		cur, err := e.client.ResourceV1().ResourceClaims("team-a").Get(e.ctx, "c", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Devices = []resourceapi.AllocatedDeviceStatus{usageStatus(t, cur, sid, sizing.Usage{
			From: t0.Add(time.Duration(i-1) * 5 * time.Minute), To: t0.Add(time.Duration(i) * 5 * time.Minute), Samples: 30,
			MemoryMaxBytes: peakGiB << 30, SMSamples: 30, SMP95Percent: 35})}
		if _, err := e.client.ResourceV1().ResourceClaims("team-a").UpdateStatus(e.ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		e.settle()
	}
	report(1, 9, share)
	report(2, 11, share)
	if _, ok := e.c.Recommendation(w); ok {
		t.Fatal("a recommendation on 60 samples")
	}
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 0 {
		t.Fatalf("events before enough samples: %q", ev)
	}
	// A status entry for a share the allocation does not hold is not the claim's use.
	report(3, 70, "00000000-0000-0000-0000-000000000000")
	if _, ok := e.c.Recommendation(w); ok {
		t.Fatal("a share outside the allocation counted")
	}
	report(3, 10, share)
	rec, ok := e.c.Recommendation(w)
	if !ok || rec.PeakBytes != 11<<30 || rec.MemoryBytes < 11<<30 || rec.MemoryBytes > 13<<30 {
		t.Fatalf("recommendation %+v, %v; want above the 11Gi peak with headroom", rec, ok)
	}
	ev := e.events(ReasonSizingRecommendation)
	if len(ev) != 1 || !strings.Contains(ev[0], "Deployment team-a/web request gpu: recommended memory") || !strings.Contains(ev[0], "nothing is changed") {
		t.Fatalf("events %q; want one recommendation for Deployment web", ev)
	}
	// The same report again (a resync) changes nothing, and an unmoved one tells no one.
	report(3, 10, share)
	report(4, 10, share)
	if ev := e.events(ReasonSizingRecommendation); len(ev) != 1 {
		t.Fatalf("events %q; want still one", ev)
	}
	if got, _ := e.c.Recommendation(w); got.Samples != 120 {
		t.Fatalf("samples %d; want 120 (the repeated report counted once)", got.Samples)
	}
}

func TestTopOwner(t *testing.T) {
	for _, tc := range []struct {
		kind, owner string
		labels      map[string]string
		want        string
	}{
		{"ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "7c9d5"}, "Deployment/web"},
		{"ReplicaSet", "plain-rs", nil, "ReplicaSet/plain-rs"},
		{"ReplicaSet", "web-7c9d5", map[string]string{"pod-template-hash": "other"}, "ReplicaSet/web-7c9d5"},
		{"StatefulSet", "db", nil, "StatefulSet/db"},
		{"Job", "nightly-29471040", nil, "CronJob/nightly"},
		{"Job", "train", nil, "Job/train"},
		{"", "", nil, "Pod/p"},
	} {
		p := ownedPod("ns", "p", tc.kind, tc.owner, tc.labels)
		if tc.kind == "" {
			p.OwnerReferences = nil
		}
		got := topOwner(p)
		if got.Kind+"/"+got.Name != tc.want {
			t.Errorf("%s %s: %s/%s, want %s", tc.kind, tc.owner, got.Kind, got.Name, tc.want)
		}
	}
}
