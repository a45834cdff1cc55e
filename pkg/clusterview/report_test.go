package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
)

// ownedBy makes pod the child of a controller: a ReplicaSet named <deployment>-<hash> is
// its Deployment's, as the allocator names workloads.
func ownedBy(pod *corev1.Pod, kind, name string) *corev1.Pod {
	pod.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: ptr.To(true)}}
	if kind == "ReplicaSet" {
		pod.Labels["pod-template-hash"] = name[strings.LastIndex(name, "-")+1:]
	}
	return pod
}

// held is a claim pod uses, allocated on node/device: whole when mem is "" (no memory
// consumed), else a share of mem.
func held(pod *corev1.Pod, node, device, mem string) *resourceapi.ResourceClaim {
	b := builders.MakeClaim(pod.Namespace, pod.Name+"-gpu")
	if mem != "" {
		b = b.Memory(mem)
	}
	cl := b.AllocatedOn(node, device).Obj()
	cl.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}}
	return cl
}

// measured writes the plugin's usage report into the claim's status: memory p95 and peak in
// GiB, SM p95 and mean (no SM samples where both are 0), ending at to.
func measured(cl *resourceapi.ResourceClaim, p95, peak float64, smP95, smMean int, to time.Time) *resourceapi.ResourceClaim {
	res := cl.Status.Allocation.Devices.Results[0]
	sm := 0
	if smP95 > 0 {
		sm = 30
	}
	u := api.ShareUsage{From: to.Add(-5 * time.Minute), To: to, Samples: 30, MemoryP95Bytes: int64(p95 * (1 << 30)), MemoryMaxBytes: int64(peak * (1 << 30)),
		SMSamples: sm, SMP95Percent: smP95, SMMeanPercent: smMean}
	raw, err := json.Marshal(api.DeviceStatusData{Mode: "mps", Usage: &u})
	if err != nil {
		panic(err)
	}
	sid := string(*res.ShareID)
	cl.Status.Devices = []resourceapi.AllocatedDeviceStatus{{Driver: res.Driver, Pool: res.Pool, Device: res.Device, ShareID: &sid, Data: &runtime.RawExtension{Raw: raw}}}
	return cl
}

// recommended is the allocator's recommendation event for w: memGiB, compute percent.
func recommended(t *testing.T, name, source string, w api.SizingWorkload, memGiB int64, compute int, at time.Time) *corev1.Event {
	ev := recEvent(t, w.Namespace, name, source, at, w, memGiB)
	raw, err := json.Marshal(api.SizingRecord{Workload: w, Recommendation: api.SizingRecommendation{MemoryBytes: memGiB << 30, ComputePercent: compute, Samples: 400, PeakBytes: (memGiB - 1) << 30}})
	if err != nil {
		t.Fatal(err)
	}
	ev.Annotations[api.AnnotationSizingRecord] = string(raw)
	return ev
}

// asJSON shows a report in a failure: a WorkloadReport's %v is its workload's name alone
// (the embedded SizingWorkload's String).
func asJSON(v any) string {
	raw, err := json.Marshal(v)
	if err != nil {
		return err.Error()
	}
	return string(raw)
}

func workload(ns, kind, name string) api.SizingWorkload {
	return api.SizingWorkload{Namespace: ns, Kind: kind, Name: name, Request: "gpu"}
}

// reportCluster: two nodes of two 80Gi GPUs. team-a's Deployment web runs two replicas on a
// whole GPU each, measured at 6-7Gi, recommended 8Gi. team-b's Job train holds a whole GPU it
// keeps busy; its bare pod notebook holds a 10Gi share, measured last two hours ago, never
// recommended. Someone in team-b forged a recommendation for notebook.
func reportCluster(t *testing.T) []runtime.Object {
	now := t0
	webA := ownedBy(builders.MakePod("team-a", "web-7c9d5-a1").Obj(), "ReplicaSet", "web-7c9d5")
	webB := ownedBy(builders.MakePod("team-a", "web-7c9d5-b2").Obj(), "ReplicaSet", "web-7c9d5")
	train := ownedBy(builders.MakePod("team-b", "train-x1").Obj(), "Job", "train")
	notebook := builders.MakePod("team-b", "notebook").Obj()
	return []runtime.Object{builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"), webA, webB, train, notebook,
		measured(held(webA, "n1", "gpu-0", ""), 6, 7, 20, 10, now.Add(-time.Minute)),
		measured(held(webB, "n1", "gpu-1", ""), 6.5, 7, 30, 20, now.Add(-3*time.Minute)),
		measured(held(train, "n2", "gpu-0", ""), 30, 31, 97, 92, now.Add(-2*time.Minute)),
		measured(held(notebook, "n2", "gpu-1", "10Gi"), 2, 3, 0, 0, now.Add(-2*time.Hour)),
		recommended(t, "e1", "fgpu-allocator", workload("team-a", "Deployment", "web"), 8, 40, now.Add(-10*time.Minute)),
		recommended(t, "e2", "fgpu-allocator", workload("team-b", "Job", "train"), 36, 95, now.Add(-20*time.Minute)),
		recommended(t, "e3", "someone-else", workload("team-b", "Pod", "notebook"), 1, 5, now.Add(-time.Minute)),
	}
}

func TestReportPerWorkloadAndTheGPUsNeeded(t *testing.T) {
	r, err := Report(context.Background(), fake.NewClientset(reportCluster(t)...), api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Workloads) != 3 {
		t.Fatalf("workloads %s; want web, train and notebook", asJSON(r.Workloads))
	}
	web, train, notebook := r.Workloads[0], r.Workloads[1], r.Workloads[2]
	if web.Kind != "Deployment" || web.Name != "web" || web.Shares != 2 || web.GPUs != 2 || web.MemoryHeldBytes != 160<<30 {
		t.Errorf("web %s; want Deployment/web, 2 shares on 2 GPUs, 160Gi", asJSON(web))
	}
	if u := web.Used; u == nil || u.Shares != 2 || u.MemoryP95Bytes != 12.5*(1<<30) || u.MemoryPeakBytes != 14<<30 || *u.SMP95Percent != 30 || *u.SMMeanPercent != 15 ||
		!u.From.Equal(t0.Add(-8*time.Minute)) || !u.To.Equal(t0.Add(-time.Minute)) {
		t.Errorf("web used %+v; want the two replicas' sums, SM 30%% p95 and 15%% mean", u)
	}
	if web.Recommendation == nil || web.Recommendation.MemoryBytes != 8<<30 || web.KeepsWhole {
		t.Errorf("web recommendation %+v", web.Recommendation)
	}
	if train.Kind != "Job" || train.Recommendation == nil || !train.KeepsWhole || train.Used.SMP95Percent == nil {
		t.Errorf("train %s; want a busy Job that keeps its whole GPU", asJSON(train))
	}
	if notebook.Kind != "Pod" || notebook.Used != nil || notebook.Recommendation != nil || notebook.MemoryHeldBytes != 10<<30 {
		t.Errorf("notebook %s; want not measured in the last hour and no recommendation (the forged one is not fgpu's)", asJSON(notebook))
	}
	// web's two 8Gi and notebook's 10Gi share one GPU; train keeps its own.
	if r.GPUsHeld != 4 || r.MemoryHeldBytes != 250<<30 || r.GPUsNeeded == nil || *r.GPUsNeeded != 2 || r.MeasuredWorkloads != 2 || r.RecommendedWorkloads != 2 {
		t.Errorf("report %s; want 4 GPUs (250Gi) held, 2 needed, 2 measured and recommended", asJSON(r))
	}
	// Per namespace, as the allocator's metrics serve it: web at 2×8Gi; train whole, busy and
	// notebook unrecommended at what they hold; notebook's use is not measured.
	want := map[string]adoption.Namespace{
		"team-a": {Workloads: 1, MeasuredWorkloads: 1, RecommendedWorkloads: 1, GPUsHeld: 2,
			MemoryHeldBytes: 160 << 30, MemoryNeededBytes: 16 << 30, MeasuredMemoryHeldBytes: 160 << 30, MemoryP95Bytes: 12.5 * (1 << 30)},
		"team-b": {Workloads: 2, MeasuredWorkloads: 1, RecommendedWorkloads: 1, GPUsHeld: 2,
			MemoryHeldBytes: 90 << 30, MemoryNeededBytes: 90 << 30, MeasuredMemoryHeldBytes: 80 << 30, MemoryP95Bytes: 30 << 30},
	}
	if len(r.Namespaces) != len(want) {
		t.Errorf("namespaces %v; want team-a and team-b", r.Namespaces)
	}
	for name, w := range want {
		if got := r.Namespaces[name]; got == nil || *got != w {
			t.Errorf("namespace %s: %+v; want %+v", name, got, w)
		}
	}
	var out bytes.Buffer
	if err := PrintReport(&out, r); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	flat := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"4 GPUs held now (250Gi); 2 would hold the same workloads at their measured sizes (2 fewer, 50 %).",
		"2 of 3 workloads measured in the last 1h, 2 with a recommendation.", "workloads without a recommendation in the last 1h: 1 of 3, counted at what they hold now",
		"team-a/Deployment/web 2 160Gi 12.5Gi/14.0Gi 30%/15% 2×8Gi", "team-b/Job/train 1 80Gi 30.0Gi/31.0Gi 97%/92% whole, busy",
		"team-b/Pod/notebook 1 10Gi not measured - -"} {
		if !strings.Contains(flat, want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// The packing is the placement core's, from the sizes: a table of small clusters.
func TestReportPacksTheRecommendedSizes(t *testing.T) {
	a := ownedBy(builders.MakePod("ns", "a-5f6b7-x").Obj(), "ReplicaSet", "a-5f6b7")
	b := ownedBy(builders.MakePod("ns", "b-5f6b7-x").Obj(), "ReplicaSet", "b-5f6b7")
	wa, wb := workload("ns", "Deployment", "a"), workload("ns", "Deployment", "b")
	at := t0.Add(-time.Minute)
	for _, tc := range []struct {
		name       string
		gpus       int // on n1 alone; 0: two nodes of two
		objs       []runtime.Object
		held       int
		needed     *int
		unplaced   int
		notesAbout string
	}{
		{name: "two whole GPUs recommended 8Gi share one", held: 2, needed: ptr.To(1),
			objs: []runtime.Object{held(a, "n1", "gpu-0", ""), held(b, "n1", "gpu-1", ""),
				recommended(t, "ra", "fgpu-allocator", wa, 8, 40, at), recommended(t, "rb", "fgpu-allocator", wb, 8, 40, at)}},
		{name: "one without a recommendation keeps its whole GPU", held: 2, needed: ptr.To(2),
			objs: []runtime.Object{held(a, "n1", "gpu-0", ""), held(b, "n1", "gpu-1", ""), recommended(t, "ra", "fgpu-allocator", wa, 8, 40, at)}},
		{name: "a share without a recommendation packs at what it holds", held: 2, needed: ptr.To(1),
			objs: []runtime.Object{held(a, "n1", "gpu-0", ""), held(b, "n2", "gpu-0", "70Gi"), recommended(t, "ra", "fgpu-allocator", wa, 10, 40, at)}},
		{name: "a busy workload keeps its whole GPU", held: 2, needed: ptr.To(2),
			objs: []runtime.Object{held(a, "n1", "gpu-0", ""), held(b, "n1", "gpu-1", ""),
				recommended(t, "ra", "fgpu-allocator", wa, 8, 95, at), recommended(t, "rb", "fgpu-allocator", wb, 8, 40, at)}},
		{name: "a busy workload that holds a share is sized", held: 2, needed: ptr.To(1),
			objs: []runtime.Object{held(a, "n1", "gpu-0", "30Gi"), held(b, "n1", "gpu-1", "30Gi"),
				recommended(t, "ra", "fgpu-allocator", wa, 8, 95, at), recommended(t, "rb", "fgpu-allocator", wb, 8, 40, at)}},
		{name: "recommendations larger than what is held need more GPUs", held: 1, needed: ptr.To(2),
			objs: []runtime.Object{held(a, "n1", "gpu-0", "30Gi"), held(b, "n1", "gpu-0", "30Gi"),
				recommended(t, "ra", "fgpu-allocator", wa, 50, 40, at), recommended(t, "rb", "fgpu-allocator", wb, 50, 40, at)}},
		{name: "no recommendation: nothing to compare", held: 2, notesAbout: "no GPU use measured in the last 1h",
			objs: []runtime.Object{held(a, "n1", "gpu-0", ""), held(b, "n1", "gpu-1", "")}},
		{name: "what the cluster cannot hold is told", gpus: 1, held: 1, needed: ptr.To(1), unplaced: 1, notesAbout: "no room for 1 share",
			objs: []runtime.Object{held(a, "n1", "gpu-0", "40Gi"), held(b, "n1", "gpu-0", "40Gi"),
				recommended(t, "ra", "fgpu-allocator", wa, 100, 40, at), recommended(t, "rb", "fgpu-allocator", wb, 100, 40, at)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := []runtime.Object{builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"), a, b}
			if tc.gpus > 0 {
				objs = []runtime.Object{builders.MakeSlice("n1", tc.gpus, "80Gi"), a, b}
			}
			objs = append(objs, tc.objs...)
			r, err := Report(context.Background(), fake.NewClientset(objs...), api.DriverName, "fgpu-system", "", "ns", time.Hour, t0)
			if err != nil {
				t.Fatal(err)
			}
			if r.GPUsHeld != tc.held || fmt.Sprint(ptr.Deref(r.GPUsNeeded, -1)) != fmt.Sprint(ptr.Deref(tc.needed, -1)) || r.UnplacedShares != tc.unplaced {
				t.Errorf("held %d, needed %v, unplaced %d; want %d, %v, %d", r.GPUsHeld, ptr.Deref(r.GPUsNeeded, -1), r.UnplacedShares, tc.held, ptr.Deref(tc.needed, -1), tc.unplaced)
			}
			if notes := strings.Join(r.Notes, "; "); !strings.Contains(notes, tc.notesAbout) {
				t.Errorf("notes %q; want one about %q", notes, tc.notesAbout)
			}
		})
	}
}

func TestReportSaysWhatWasNotMeasured(t *testing.T) {
	web := ownedBy(builders.MakePod("team-a", "web-7c9d5-a1").Obj(), "ReplicaSet", "web-7c9d5")
	old := t0.Add(-3 * time.Hour)
	c := fake.NewClientset(builders.MakeSlice("n1", 1, "80Gi"), web, measured(held(web, "n1", "gpu-0", ""), 6, 7, 20, 10, old),
		recommended(t, "e1", "fgpu-allocator", workload("team-a", "Deployment", "web"), 8, 40, old))
	for _, tc := range []struct {
		since    time.Duration
		measured bool
		want     string
	}{
		{time.Hour, false, "no GPU use measured in the last 1h: of the 1 share placed in any namespace, none has a usage report that recent"},
		{90 * time.Minute, false, "no GPU use measured in the last 1h30m"},
		{4 * time.Hour, true, "1 GPU held now (80Gi); 1 would hold the same workloads at their measured sizes (no fewer)."},
	} {
		r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "", tc.since, t0)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Workloads[0].Used != nil; got != tc.measured || (r.Workloads[0].Recommendation != nil) != tc.measured || (r.GPUsNeeded != nil) != tc.measured {
			t.Errorf("since %s: measured %v, recommendation %+v, needed %v; want measured and recommended %v", tc.since, got, r.Workloads[0].Recommendation, r.GPUsNeeded, tc.measured)
		}
		var out bytes.Buffer
		if err := PrintReport(&out, r); err != nil {
			t.Fatal(err)
		}
		fits80(t, out.String())
		if flat := strings.Join(strings.Fields(out.String()), " "); !strings.Contains(flat, tc.want) {
			t.Errorf("since %s: report lacks %q:\n%s", tc.since, tc.want, out.String())
		}
		if !tc.measured && (strings.Contains(out.String(), "0Ki") || !strings.Contains(out.String(), "not measured")) {
			t.Errorf("since %s: zeros where nothing was measured:\n%s", tc.since, out.String())
		}
	}
	if _, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "", 0, t0); err == nil {
		t.Error("a window of 0 was taken")
	}
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "team-c", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := PrintReport(&out, r); err != nil || out.String() != "no GPU is held through fgpu's claims in namespace team-c: nothing to report.\n" {
		t.Errorf("an empty namespace: %v %q", err, out.String())
	}
	if raw, _ := json.Marshal(r); !strings.Contains(string(raw), `"workloads":[]`) {
		t.Errorf("no workloads: %s; want [] for scripts", raw)
	}
}

func TestReportMarksAPartlyMeasuredWorkload(t *testing.T) {
	webA := ownedBy(builders.MakePod("team-a", "web-7c9d5-a1").Obj(), "ReplicaSet", "web-7c9d5")
	webB := ownedBy(builders.MakePod("team-a", "web-7c9d5-b2").Obj(), "ReplicaSet", "web-7c9d5")
	c := fake.NewClientset(builders.MakeSlice("n1", 2, "80Gi"), webA, webB,
		measured(held(webA, "n1", "gpu-0", ""), 6, 7, 0, 0, t0), held(webB, "n1", "gpu-1", ""))
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "team-a", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if u := r.Workloads[0].Used; u == nil || u.Shares != 1 || u.MemoryHeldBytes != 80<<30 || u.SMP95Percent != nil || r.Workloads[0].Shares != 2 {
		t.Fatalf("web %s; want one of two shares measured, against its 80Gi, no SM samples", asJSON(r.Workloads[0]))
	}
	var out bytes.Buffer
	if err := PrintReport(&out, r); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	for _, want := range []string{"team-a/Deployment/web  2     160Gi  6.0Gi/7.0Gi*   -", "* only some of its shares measured in the window"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// The report only reads, with the caller's client: one namespace needs no right beyond it.
func TestReportReadsOnlyWhatTheCallerMayList(t *testing.T) {
	c := fake.NewClientset(reportCluster(t)...)
	c.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if v := a.GetVerb(); v != "list" && v != "get" {
			t.Errorf("the report %ss %s", v, a.GetResource().Resource)
		}
		if r := a.GetResource().Resource; a.GetNamespace() == "" && (r == "resourceclaims" || r == "pods" || r == "events") {
			return true, nil, apierrors.NewForbidden(a.GetResource().GroupResource(), "", fmt.Errorf("team-a's user"))
		}
		return false, nil, nil
	})
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "team-a", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Workloads) != 1 || r.Workloads[0].Namespace != "team-a" || r.GPUsHeld != 2 || *r.GPUsNeeded != 1 {
		t.Errorf("team-a's report %s; want web alone, 2 GPUs held, 1 needed", asJSON(r))
	}
	if _, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "", time.Hour, t0); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "with -n") {
		t.Errorf("every namespace without the right to list them: %v; want forbidden, and to name one with -n", err)
	}
}

// -o json: the names are the report's contract with scripts.
func TestReportJSON(t *testing.T) {
	r, err := Report(context.Background(), fake.NewClientset(reportCluster(t)...), api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{`"since":"1h"`, `"from":"2026-01-01T11:00:00Z"`, `"gpusHeld":4`, `"memoryHeldBytes":268435456000`, `"gpusNeeded":2`,
		`"measuredWorkloads":2`, `"recommendedWorkloads":2`, `"namespace":"team-a","kind":"Deployment","name":"web","request":"gpu"`, `"shares":2`, `"gpus":2`,
		`"used":{"shares":2,"memoryHeldBytes":171798691840,"memoryP95Bytes":13421772800,"memoryPeakBytes":15032385536,"smP95Percent":30,"smMeanPercent":15`,
		`"recommendation":{"memoryBytes":8589934592,"computePercent":40`, `"recommendedAt":"2026-01-01T11:50:00Z"`, `"keepsWhole":true`, `"notes":["workloads without a recommendation in the last 1h: 1 of 3`} {
		if !strings.Contains(string(raw), name) {
			t.Errorf("json lacks %s:\n%s", name, raw)
		}
	}
	var back UsageReport
	roundTrip(t, r, &back)
	if back.GPUsHeld != 4 || *back.GPUsNeeded != 2 || len(back.Workloads) != 3 || back.Workloads[0].Used.MemoryPeakBytes != 14<<30 ||
		*back.Workloads[0].Used.SMP95Percent != 30 || back.Workloads[2].Used != nil || back.Workloads[0].Name != "web" {
		t.Errorf("json round trip %s", asJSON(back))
	}
}

func TestWindow(t *testing.T) {
	for d, want := range map[time.Duration]string{24 * time.Hour: "24h", 90 * time.Minute: "1h30m", 30 * time.Minute: "30m", 90 * time.Second: "1m30s",
		time.Hour + 30*time.Second: "1h0m30s", time.Second: "1s"} {
		if got := window(d); got != want {
			t.Errorf("window(%s) = %q, want %q", d, got, want)
		}
	}
}

// observedMap is a kubelet plugin's observed-usage ConfigMap for node in namespace ns: pod
// uses its GPU device at p95 and peak GiB, measured until to.
func observedMap(ns, node string, pod *corev1.Pod, device string, p95, peak float64, to time.Time) *corev1.ConfigMap {
	u := api.ObservedUsage{Node: node, Pods: []api.ObservedPod{{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), GPUs: []api.ObservedGPU{{
		UUID: "GPU-" + device, Device: device, Usage: api.ShareUsage{From: to.Add(-5 * time.Minute), To: to, Samples: 30,
			MemoryP95Bytes: int64(p95 * (1 << 30)), MemoryMaxBytes: int64(peak * (1 << 30)), SMSamples: 30, SMP95Percent: 20, SMMeanPercent: 10}}}}}}
	raw, _ := json.Marshal(u)
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: api.ObservedUsagePrefix + node, Labels: map[string]string{api.LabelObservedUsage: node}},
		Data: map[string]string{api.ObservedUsageKey: string(raw)}}
}

// A Deployment that NVIDIA's device plugin serves (a whole GPU a pod), measured by observe
// mode, is reported beside fgpu's claims: the GPUs it holds now, its use, and fgpu's size
// for it packed into the GPUs needed. The same written in a tenant's namespace counts for
// nothing.
func TestReportCountsPodsObservedOutsideFgpu(t *testing.T) {
	a := asking(ownedBy(builders.MakePod("team-d", "infer-5f-a").Bound("n1").Obj(), "ReplicaSet", "infer-5f"), 1)
	b := asking(ownedBy(builders.MakePod("team-d", "infer-5f-b").Bound("n2").Obj(), "ReplicaSet", "infer-5f"), 1)
	forged := builders.MakePod("team-e", "forged").Bound("n1").Obj()
	infer := api.SizingWorkload{Namespace: "team-d", Kind: "Deployment", Name: "infer", Request: api.ExtendedResourceRequest}
	c := fake.NewClientset(builders.MakeSlice("n1", 2, "80Gi"), builders.MakeSlice("n2", 2, "80Gi"), gpuNode("n1", 2), gpuNode("n2", 2), a, b, forged,
		observedMap("fgpu-system", "n1", a, "gpu-0", 9, 10, t0.Add(-time.Minute)),
		observedMap("fgpu-system", "n2", b, "gpu-1", 8, 9, t0.Add(-time.Minute)),
		observedMap("team-e", "n1", forged, "gpu-1", 1, 1, t0.Add(-time.Minute)),
		recommended(t, "e1", "fgpu-allocator", infer, 12, 30, t0.Add(-time.Minute)))
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Workloads) != 1 {
		t.Fatalf("workloads %s; want team-d's Deployment alone", asJSON(r.Workloads))
	}
	w := r.Workloads[0]
	if w.SizingWorkload != infer || !w.Observed || w.GPUs != 2 || w.MemoryHeldBytes != 160<<30 || w.Used == nil || w.Used.MemoryPeakBytes != 19<<30 {
		t.Errorf("infer %s; want Deployment team-d/infer observed on 2 whole GPUs, peak 19Gi", asJSON(w))
	}
	if r.GPUsHeld != 2 || r.GPUsNeeded == nil || *r.GPUsNeeded != 1 {
		t.Errorf("held %d, needed %v; want 2 held, 1 needed (two 12Gi shares)", r.GPUsHeld, r.GPUsNeeded)
	}
	var out strings.Builder
	if err := PrintReport(&out, r); err != nil || !strings.Contains(out.String(), "+team-d/Deployment/infer") || !strings.Contains(out.String(), "outside fgpu") {
		t.Errorf("printed %q (%v): want the workload marked as held outside fgpu", out.String(), err)
	}
}

// asking makes pod's container ask for n of nvidia.com/gpu, as a pod written for NVIDIA's
// device plugin does.
func asking(pod *corev1.Pod, n int64) *corev1.Pod {
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{DefaultExtendedResource: *resource.NewQuantity(n, resource.DecimalSI)}
	return pod
}

// gpuNode is a node whose device plugin advertises n of nvidia.com/gpu.
func gpuNode(name string, n int64) *corev1.Node {
	node := builders.MakeNode(name).Obj()
	node.Status.Allocatable[DefaultExtendedResource] = *resource.NewQuantity(n, resource.DecimalSI)
	return node
}

// observedOn is a kubelet plugin's ConfigMap for node in fgpu-system: each pod used the
// device named beside it, 4Gi at p95 and 5Gi at peak, until to.
func observedOn(node string, to time.Time, uses map[*corev1.Pod]string) *corev1.ConfigMap {
	u := api.ObservedUsage{Node: node, Pods: []api.ObservedPod{}}
	for p, device := range uses {
		u.Pods = append(u.Pods, api.ObservedPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), GPUs: []api.ObservedGPU{{
			UUID: "GPU-" + device, Device: device, Usage: api.ShareUsage{From: to.Add(-5 * time.Minute), To: to, Samples: 30,
				MemoryP95Bytes: 4 << 30, MemoryMaxBytes: 5 << 30, SMSamples: 30, SMP95Percent: 20, SMMeanPercent: 10}}}})
	}
	raw, _ := json.Marshal(u)
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "fgpu-system", Name: api.ObservedUsagePrefix + node, Labels: map[string]string{api.LabelObservedUsage: node}},
		Data: map[string]string{api.ObservedUsageKey: string(raw)}}
}

// Pods that time-slice one GPU under NVIDIA's device plugin (a node that advertises more
// nvidia.com/gpu than it has GPUs) hold that GPU once, with all its memory; one that ran
// nothing seen is put on the same GPU's spare replicas, and the most it could hold is told.
func TestReportCountsATimeSlicedGPUOnce(t *testing.T) {
	a := asking(ownedBy(builders.MakePod("team-d", "chat-5f-a").Bound("n1").Obj(), "ReplicaSet", "chat-5f"), 1)
	b := asking(ownedBy(builders.MakePod("team-d", "chat-5f-b").Bound("n1").Obj(), "ReplicaSet", "chat-5f"), 1)
	idle := asking(builders.MakePod("team-d", "notebook").Bound("n1").Obj(), 1)
	objs := []runtime.Object{builders.MakeSlice("n1", 2, "80Gi"), gpuNode("n1", 8), a, b, observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{a: "gpu-0", b: "gpu-0"})}
	chat := api.SizingWorkload{Namespace: "team-d", Kind: "Deployment", Name: "chat", Request: api.ExtendedResourceRequest}

	r, err := Report(context.Background(), fake.NewClientset(objs...), api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Workloads) != 1 || r.GPUsHeld != 1 || r.GPUsHeldAtMost != nil || r.MemoryHeldBytes != 80<<30 {
		t.Fatalf("report %s; want chat alone, 1 GPU (80Gi) held", asJSON(r))
	}
	if w := r.Workloads[0]; w.SizingWorkload != chat || w.Shares != 2 || w.GPUs != 1 || w.MemoryHeldBytes != 80<<30 || !w.TimeSliced || w.GPUsEstimated ||
		w.Used == nil || w.Used.MemoryHeldBytes != 80<<30 || w.Used.MemoryPeakBytes != 10<<30 {
		t.Errorf("chat %s; want 2 pods on 1 time-sliced GPU, 80Gi held, peak 10Gi", asJSON(w))
	}
	if notes := strings.Join(r.Notes, "; "); !strings.Contains(notes, "on node n1, the device plugin shares each GPU as 4 units of nvidia.com/gpu") {
		t.Errorf("notes %q; want the sharing told", notes)
	}
	var out bytes.Buffer
	if err := PrintReport(&out, r); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	for _, want := range []string{"1 GPU held now (80Gi)", "+team-d/Deployment/chat  1~", "~ the device plugin shares its GPUs"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}

	// With a recommendation, and with an idle pod beside them.
	objs = append(objs, idle, recommended(t, "e1", "fgpu-allocator", chat, 12, 30, t0.Add(-time.Minute)))
	r, err = Report(context.Background(), fake.NewClientset(objs...), api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUsHeld != 1 || r.GPUsHeldAtMost == nil || *r.GPUsHeldAtMost != 2 || r.GPUsNeeded == nil || *r.GPUsNeeded != 1 {
		t.Errorf("held %d to %v, needed %v; want 1 to 2 held, 1 needed", r.GPUsHeld, r.GPUsHeldAtMost, r.GPUsNeeded)
	}
	if len(r.Workloads) != 2 || r.Workloads[1].Name != "notebook" || r.Workloads[1].GPUs != 1 || !r.Workloads[1].GPUsEstimated || r.Workloads[1].NoSamples != 1 {
		t.Errorf("workloads %s; want the notebook on 1 GPU, estimated, no samples", asJSON(r.Workloads))
	}
	if notes := strings.Join(r.Notes, "; "); !strings.Contains(notes, "1 pod ran nothing seen on 1 unit of nvidia.com/gpu in the window") || !strings.Contains(notes, "(1 to 2 GPUs)") {
		t.Errorf("notes %q; want the unlocated replica told", notes)
	}
	out.Reset()
	if err := PrintReport(&out, r); err != nil || !strings.Contains(out.String(), "1 to 2 GPUs held now (at least 80Gi)") {
		t.Errorf("printed %q (%v); want the range of GPUs held", out.String(), err)
	}
	raw, _ := json.Marshal(r)
	for _, name := range []string{`"gpusHeld":1`, `"gpusHeldAtMost":2`, `"timeSliced":true`, `"gpusEstimated":true`, `"noSamples":1`} {
		if !strings.Contains(string(raw), name) {
			t.Errorf("json lacks %s:\n%s", name, raw)
		}
	}
}

// A pod that holds a GPU through the device plugin but ran nothing in the window (an idle
// notebook) holds it all the same: counted, its use told as no samples. On a node fgpu does
// not publish, a pod's GPUs count whole, of unknown memory, and as they are in the GPUs
// needed. A pod finished, or one fgpu's admission policy rewrote (its resource is gone:
// it holds a claim), holds none.
func TestReportCountsIdlePodsThatHoldGPUs(t *testing.T) {
	idle := asking(builders.MakePod("team-d", "notebook").Bound("n1").Obj(), 1)
	elsewhere := asking(ownedBy(builders.MakePod("team-d", "train-x").Bound("n9").Obj(), "Job", "train"), 2)
	done := asking(builders.MakePod("team-d", "done").Bound("n1").Obj(), 1)
	done.Status.Phase = corev1.PodSucceeded
	rewritten := builders.MakePod("team-d", "rewritten").Bound("n1").Label(api.LabelExtendedResource, "true").Claim(api.ExtendedResourcePodClaimPrefix + "0").Obj()
	c := fake.NewClientset(builders.MakeSlice("n1", 2, "80Gi"), gpuNode("n1", 2), idle, elsewhere, done, rewritten,
		recommended(t, "e1", "fgpu-allocator", workload("team-d", "Pod", "other"), 8, 30, t0.Add(-time.Minute)))
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "team-d", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Workloads) != 2 {
		t.Fatalf("workloads %s; want the notebook and train", asJSON(r.Workloads))
	}
	train, notebook := r.Workloads[0], r.Workloads[1]
	if notebook.Name != "notebook" || !notebook.Observed || notebook.GPUs != 1 || notebook.MemoryHeldBytes != 80<<30 || notebook.Used != nil || notebook.NoSamples != 1 || notebook.TimeSliced {
		t.Errorf("notebook %s; want 1 whole GPU held, no samples", asJSON(notebook))
	}
	if train.Name != "train" || train.GPUs != 2 || train.MemoryHeldBytes != 0 || train.NoSamples != 0 {
		t.Errorf("train %s; want 2 GPUs of unknown memory, not measured", asJSON(train))
	}
	if r.GPUsHeld != 3 || r.MemoryHeldBytes != 80<<30 || r.GPUsHeldAtMost != nil {
		t.Errorf("report %s; want 3 GPUs held (80Gi known)", asJSON(r))
	}
	if notes := strings.Join(r.Notes, "; "); !strings.Contains(notes, "2 GPUs asked for as nvidia.com/gpu on 1 node (n9) that fgpu does not publish") {
		t.Errorf("notes %q; want the unpublished node told", notes)
	}
	var out bytes.Buffer
	if err := PrintReport(&out, r); err != nil {
		t.Fatal(err)
	}
	fits80(t, out.String())
	flat := strings.Join(strings.Fields(out.String()), " ")
	for _, want := range []string{"3 GPUs held now (80Gi)", "+team-d/Pod/notebook 1 80Gi no samples - -", "+team-d/Job/train 2 0 not measured - -"} {
		if !strings.Contains(flat, want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}

// The GPUs needed keep a workload without a recommendation at what it holds: a whole GPU
// a pod, or, time-sliced, its slice of the GPU.
func TestReportPacksObservedPodsAtWhatTheyHold(t *testing.T) {
	a := asking(builders.MakePod("ns", "a").Bound("n1").Obj(), 1)
	b := asking(builders.MakePod("ns", "b").Bound("n1").Obj(), 1)
	other := ownedBy(builders.MakePod("ns", "o-5f6b7-x").Bound("n1").Obj(), "ReplicaSet", "o-5f6b7")
	rec := recommended(t, "ro", "fgpu-allocator", workload("ns", "Deployment", "o"), 8, 40, t0.Add(-time.Minute))
	for _, tc := range []struct {
		name   string
		node   *corev1.Node
		needed int
	}{
		{"whole GPUs stay whole", gpuNode("n1", 4), 3},
		{"time-sliced pods keep sharing", gpuNode("n1", 8), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(builders.MakeSlice("n1", 4, "80Gi"), tc.node, a, b, other, held(other, "n1", "gpu-3", ""), rec,
				observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{a: "gpu-0", b: "gpu-1"}))
			r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "ns", time.Hour, t0)
			if err != nil {
				t.Fatal(err)
			}
			if r.GPUsHeld != 3 || r.GPUsNeeded == nil || *r.GPUsNeeded != tc.needed {
				t.Errorf("held %d, needed %v; want 3, %d", r.GPUsHeld, r.GPUsNeeded, tc.needed)
			}
		})
	}
}

// What one tenant does in its own namespace changes no other namespace's figures: a forged
// ConfigMap, a pod that labels itself as rewritten by fgpu, a pod that uses another
// namespace's GPU without asking for it (NVIDIA_VISIBLE_DEVICES) each count, if at all, for
// the tenant alone, and a GPU two namespaces' pods are on counts once.
func TestReportTenantsCannotMoveOtherNamespacesFigures(t *testing.T) {
	infer := asking(ownedBy(builders.MakePod("team-d", "infer-5f-a").Bound("n1").Obj(), "ReplicaSet", "infer-5f"), 1)
	idle := asking(builders.MakePod("team-d", "notebook").Bound("n1").Obj(), 1)
	base := []runtime.Object{builders.MakeSlice("n1", 4, "80Gi"), gpuNode("n1", 4), infer, idle}
	honest := slices.Concat(base, []runtime.Object{observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{infer: "gpu-0"})})

	hidden := asking(builders.MakePod("team-e", "hidden").Bound("n1").Label(api.LabelExtendedResource, "true").Obj(), 1)
	snoop := builders.MakePod("team-e", "snoop").Bound("n1").Obj()
	forged := observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{infer: "gpu-2", idle: "gpu-3"})
	forged.Namespace = "team-e"
	tenant := slices.Concat(base, []runtime.Object{hidden, snoop, forged,
		observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{infer: "gpu-0", snoop: "gpu-0"})})

	figures := func(r *UsageReport, ns string) string {
		var out []string
		for _, w := range r.Workloads {
			if w.Namespace == ns {
				out = append(out, asJSON(w))
			}
		}
		return strings.Join(out, "\n")
	}
	for _, ns := range []string{"", "team-d"} {
		before, err := Report(context.Background(), fake.NewClientset(honest...), api.DriverName, "fgpu-system", "", ns, time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		after, err := Report(context.Background(), fake.NewClientset(tenant...), api.DriverName, "fgpu-system", "", ns, time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		if b, a := figures(before, "team-d"), figures(after, "team-d"); a != b {
			t.Errorf("-n %q: team-d's figures moved:\n%s\nto\n%s", ns, b, a)
		}
		if ns == "team-d" && (after.GPUsHeld != 2 || after.MemoryHeldBytes != 160<<30) {
			t.Errorf("-n team-d: %s; want 2 GPUs (160Gi) held", asJSON(after))
		}
		if ns == "" && (before.GPUsHeld != 2 || after.GPUsHeld != 3 || len(after.Workloads) != 4) {
			t.Errorf("held %d, then %d with team-e's pods (%s); want 2, then 3: hidden's GPU, and gpu-0 once", before.GPUsHeld, after.GPUsHeld, asJSON(after.Workloads))
		}
	}
}

// On a node that time-slices, a namespace's pods that ran nothing seen go first on the spare
// replicas of the GPUs that namespace was seen on: another namespace's idle pods, earlier in
// name order, do not push its estimate onto more GPUs.
func TestReportPlacesIdleTimeSlicedPodsByTheirOwnNamespace(t *testing.T) {
	a := asking(builders.MakePod("team-a", "a").Bound("n1").Obj(), 1)
	z := asking(builders.MakePod("team-z", "z").Bound("n1").Obj(), 1)
	zIdle := asking(builders.MakePod("team-z", "z-idle").Bound("n1").Obj(), 1)
	used := observedOn("n1", t0.Add(-time.Minute), map[*corev1.Pod]string{a: "gpu-0", z: "gpu-1"})
	base := []runtime.Object{builders.MakeSlice("n1", 2, "80Gi"), gpuNode("n1", 4), a, z, zIdle, used}
	idle := slices.Concat(base, []runtime.Object{
		asking(builders.MakePod("team-a", "a-idle-1").Bound("n1").Obj(), 1),
		asking(builders.MakePod("team-a", "a-idle-2").Bound("n1").Obj(), 1)})
	for _, objs := range [][]runtime.Object{base, idle} {
		r, err := Report(context.Background(), fake.NewClientset(objs...), api.DriverName, "fgpu-system", "", "", time.Hour, t0)
		if err != nil {
			t.Fatal(err)
		}
		if ns := r.Namespaces["team-z"]; ns == nil || ns.GPUsHeld != 1 {
			t.Fatalf("team-z: %+v (with %d pods on the node); want its two pods on the one GPU it was seen on", ns, len(objs)-3)
		}
	}
}

// A tenant's pod counts only for what a kubelet admitted: one bound by hand to a node no
// kubelet runs (spec.nodeName is the tenant's to write) holds nothing, and one asking for
// more than its node offers holds at most what the node offers. Otherwise a pod asking for
// a billion GPUs would make the count (the allocator's, every minute) build a billion.
func TestReportCountsOnlyWhatAKubeletAdmitted(t *testing.T) {
	nowhere := asking(builders.MakePod("team-e", "nowhere").Bound("no-such-node").Obj(), 1_000_000_000)
	nowhere.Status.HostIP = ""
	greedy := asking(builders.MakePod("team-e", "greedy").Bound("n2").Obj(), 1_000_000_000)
	c := fake.NewClientset(builders.MakeSlice("n1", 2, "80Gi"), gpuNode("n1", 2), gpuNode("n2", 4), nowhere, greedy)
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if r.GPUsHeld != 4 || len(r.Workloads) != 1 || r.Workloads[0].Name != "greedy" {
		t.Fatalf("%s; want greedy alone, on the 4 GPUs its node offers", asJSON(r))
	}
}

// Where the node cannot be read, whether its device plugin shares GPUs is not known: its
// pods count whole GPUs, and the report says so.
func TestReportSaysWhereSharingIsNotKnown(t *testing.T) {
	a := asking(builders.MakePod("team-d", "a").Bound("n1").Obj(), 1)
	b := asking(builders.MakePod("team-d", "b").Bound("n1").Obj(), 1)
	c := fake.NewClientset(builders.MakeSlice("n1", 2, "80Gi"), a, b)
	c.PrependReactor("get", "nodes", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("nodes"), "n1", fmt.Errorf("team-d's user"))
	})
	r, err := Report(context.Background(), c, api.DriverName, "fgpu-system", "", "team-d", time.Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if notes := strings.Join(r.Notes, "; "); r.GPUsHeld != 2 || !strings.Contains(notes, "node n1 could not be read") || !strings.Contains(notes, "fewer are held") {
		t.Errorf("held %d, notes %q; want 2 whole GPUs, and the unknown sharing told", r.GPUsHeld, notes)
	}
}
