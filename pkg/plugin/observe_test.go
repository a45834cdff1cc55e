package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

const (
	observeNS = "fgpu-system"
	podC      = "cccccccc-2222-3333-4444-555555555555" // a pod of NVIDIA's device plugin
	podD      = "dddddddd-2222-3333-4444-555555555555" // fgpu's MPS daemon pod
	podE      = "eeeeeeee-2222-3333-4444-555555555555" // a pod the pod watch does not know
)

func podLister(t *testing.T, pods ...*corev1.Pod) corelisters.PodLister {
	t.Helper()
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range pods {
		if err := idx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	return corelisters.NewPodLister(idx)
}

func observedPod(ns, name, uid string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: node}}
}

// observedUsage reads the node's ConfigMap; nil where there is none.
func observedUsage(t *testing.T, client *k8sfake.Clientset) *configapi.ObservedUsage {
	t.Helper()
	cm, err := client.CoreV1().ConfigMaps(observeNS).Get(context.Background(), configapi.ObservedUsagePrefix+node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	if cm.Labels[configapi.LabelObservedUsage] != node {
		t.Errorf("labels %v; want %s=%s", cm.Labels, configapi.LabelObservedUsage, node)
	}
	var u configapi.ObservedUsage
	if err := json.Unmarshal([]byte(cm.Data[configapi.ObservedUsageKey]), &u); err != nil {
		t.Fatalf("%s: %v", cm.Data[configapi.ObservedUsageKey], err)
	}
	if u.Pods == nil {
		t.Errorf("%s: pods is null; want a list", cm.Data[configapi.ObservedUsageKey])
	}
	return &u
}

// A pod fgpu did not place is measured on the GPU it uses and reported in the node's
// ConfigMap once per interval; fgpu's tenants, its MPS server, host jobs and pods the pod
// watch does not know are not. A pod gone is dropped, and an empty list written.
func TestObserveMeasuresPodsFgpuDidNotPlace(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, a, []checkpoint.PodRef{{UID: podA, Name: "pa"}}); err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	tenant, tenantElsewhere, foreign, hostJob, server, unknown := livePID(t), livePID(t), livePID(t), livePID(t), livePID(t), livePID(t)
	fakeProc(t, proc, tenant, "0::/kubepods/burstable/pod"+podA+"/c\n")
	fakeProc(t, proc, tenantElsewhere, "0::/kubepods/burstable/pod"+podA+"/c\n")
	fakeProc(t, proc, foreign, "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"+underscores(podC)+".slice/cri-containerd-1.scope\n")
	fakeProc(t, proc, hostJob, "0::/system.slice/train.service\n")
	fakeProc(t, proc, server, "0::/kubepods/pod"+podD+"/mps\n")
	fakeProc(t, proc, unknown, "0::/kubepods/pod"+podE+"/c\n")
	report := func(index, pid int, gib int64, sm int) {
		t.Helper()
		if err := fake.ReportUsage(e.cfg.DevRoot, index, pid, gib<<30, sm, 0); err != nil {
			t.Fatal(err)
		}
	}
	report(0, tenant, 3, 20)
	report(1, tenantElsewhere, 1, 5)
	report(1, foreign, 6, 40)
	report(1, hostJob, 20, 90)
	report(1, server, 1, -1)
	report(0, unknown, 2, 10)

	client := k8sfake.NewClientset()
	m := newUsageMeter(e.backend(), proc, 5*time.Minute, 30*time.Minute)
	o := newObserver(client, node, observeNS, s.Devices(), 5*time.Minute, 30*time.Minute)
	o.pods = podLister(t, observedPod("ml", "train-0", podC), observedPod(observeNS, "mps-0", podD), observedPod("ns", "pa", podA))
	servers := func() []int { return []int{server} }
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	poll := func(at time.Duration) {
		t.Helper()
		_, unclaimed := m.sample(ctx, t0.Add(at), s.PreparedClaims(), o.gpus())
		o.sample(t0.Add(at), unclaimed, servers)
		if err := o.publishIfDue(ctx, t0.Add(at)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		poll(time.Duration(i) * 10 * time.Second)
		if u := observedUsage(t, client); u != nil {
			t.Fatalf("written after %d polls, before the report interval: %+v", i+1, u)
		}
	}
	uuid1 := s.devices["gpu-1"].UUID
	if len(o.uses) != 2 || o.uses[observedKey{podC, uuid1}] == nil || o.uses[observedKey{podE, s.devices["gpu-0"].UUID}] == nil {
		t.Fatalf("windows %v; want the device plugin's pod on gpu-1 and the unknown pod on gpu-0 only", o.uses)
	}
	poll(5 * time.Minute)
	u := observedUsage(t, client)
	if u == nil || u.Node != node || len(u.Pods) != 1 {
		t.Fatalf("observed %+v; want node %s with one pod", u, node)
	}
	p := u.Pods[0]
	if p.Namespace != "ml" || p.Name != "train-0" || p.UID != podC || len(p.GPUs) != 1 {
		t.Fatalf("pod %+v; want ml/train-0 on one GPU", p)
	}
	if g := p.GPUs[0]; g.UUID != uuid1 || g.Device != "gpu-1" || g.Usage.MemoryMaxBytes != 6<<30 || g.Usage.SMMaxPercent != 40 || g.Usage.Samples != 31 {
		t.Fatalf("GPU %+v; want gpu-1 at 6Gi, SM 40, over 31 samples", g)
	}
	// fgpu's tenant is measured through its claim, not observed.
	if sum := m.summaries(string(a.UID), t0.Add(5*time.Minute))[shareKey{string(a.UID), "gpu", "gpu-0"}]; sum.MemoryMaxBytes != 3<<30 {
		t.Fatalf("claim a: %+v; want its tenant's 3Gi", sum)
	}

	// The pod's process exits: a whole interval later the pod is dropped and the list emptied.
	report(1, foreign, 0, -1)
	report(0, unknown, 0, -1)
	for i := 1; i < 30; i++ {
		poll(5*time.Minute + time.Duration(i)*10*time.Second)
	}
	if len(observedUsage(t, client).Pods) != 1 {
		t.Fatal("the pod was dropped before a whole interval without processes")
	}
	poll(10 * time.Minute)
	if u := observedUsage(t, client); len(u.Pods) != 0 || len(o.uses) != 0 {
		t.Fatalf("observed %+v, windows %v; want none once the pod's processes are gone an interval", u, o.uses)
	}
}

// Nothing observed writes nothing, also at the heartbeat; a ConfigMap an earlier run left
// is emptied by the first report.
func TestObserveWritesNothingWithoutPods(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	proc := t.TempDir()
	hostJob := livePID(t)
	fakeProc(t, proc, hostJob, "0::/user.slice/session-1.scope\n")
	if err := fake.ReportUsage(e.cfg.DevRoot, 1, hostJob, 4<<30, 50, 0); err != nil {
		t.Fatal(err)
	}
	run := func(client *k8sfake.Clientset) {
		t.Helper()
		m := newUsageMeter(e.backend(), proc, time.Minute, 2*time.Minute)
		o := newObserver(client, node, observeNS, s.Devices(), time.Minute, 2*time.Minute)
		o.pods = podLister(t)
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		for i := range 60 { // 10 min
			now := t0.Add(time.Duration(i) * 10 * time.Second)
			_, unclaimed := m.sample(ctx, now, s.PreparedClaims(), o.gpus())
			o.sample(now, unclaimed, func() []int { t.Fatal("fgpu's servers asked for without a pod's process"); return nil })
			if err := o.publishIfDue(ctx, now); err != nil {
				t.Fatal(err)
			}
		}
	}
	client := k8sfake.NewClientset()
	run(client)
	for _, a := range client.Actions() {
		if a.GetVerb() != "get" {
			t.Fatalf("%s %s with nothing observed; want no write", a.GetVerb(), a.GetResource().Resource)
		}
	}
	if len(client.Actions()) != 1 {
		t.Errorf("%d reads; want one, by the first report", len(client.Actions()))
	}

	stale, _ := json.Marshal(configapi.ObservedUsage{Node: node, Pods: []configapi.ObservedPod{{Namespace: "ml", Name: "old", UID: podC}}})
	client = k8sfake.NewClientset(&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: observeNS, Name: configapi.ObservedUsagePrefix + node},
		Data: map[string]string{configapi.ObservedUsageKey: string(stale)}})
	run(client)
	if u := observedUsage(t, client); u == nil || len(u.Pods) != 0 {
		t.Fatalf("observed %+v; want the earlier run's entries gone", u)
	}
}

// The driver's loop observes beside the claims' measurement and writes the ConfigMap.
func TestWatchUsageObserves(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	proc := t.TempDir()
	pid := livePID(t)
	fakeProc(t, proc, pid, "0::/kubepods/besteffort/pod"+podC+"/c\n")
	if err := fake.ReportUsage(e.cfg.DevRoot, 1, pid, 2<<30, 20, 0); err != nil {
		t.Fatal(err)
	}
	client := k8sfake.NewClientset()
	o := newObserver(client, node, observeNS, s.Devices(), 100*time.Millisecond, time.Hour)
	o.pods = podLister(t, observedPod("ml", "train-0", podC))
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry()),
		usage: newUsageMeter(e.backend(), proc, 100*time.Millisecond, time.Hour), observe: o}
	done := make(chan struct{})
	go func() { defer close(done); d.watchUsage(ctx, 20*time.Millisecond) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		cm, err := client.CoreV1().ConfigMaps(observeNS).Get(ctx, configapi.ObservedUsagePrefix+node, metav1.GetOptions{})
		if err == nil {
			var u configapi.ObservedUsage
			if err := json.Unmarshal([]byte(cm.Data[configapi.ObservedUsageKey]), &u); err != nil || len(u.Pods) != 1 || u.Pods[0].GPUs[0].Usage.MemoryMaxBytes != 2<<30 {
				t.Fatalf("observed %s (%v); want train-0 at 2Gi", cm.Data[configapi.ObservedUsageKey], err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no observed usage within 5s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// While the writes keep failing, a pod's samples are folded rather than piled up: the
// window stays bounded, and the write that succeeds carries every sample's count, span and
// peak.
func TestObserveFoldsSamplesWhileWritesFail(t *testing.T) {
	ctx := context.Background()
	client := k8sfake.NewClientset()
	failing := true
	client.PrependReactor("*", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		if failing {
			return true, nil, apierrors.NewServiceUnavailable("the API server is away")
		}
		return false, nil, nil
	})
	o := newObserver(client, node, observeNS, []gpu.Device{{Index: 0, UUID: "GPU-0"}}, 5*time.Minute, 30*time.Minute)
	o.pods = podLister(t, observedPod("ml", "train-0", podC))
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const polls = 6 * 8640 // six days at a poll every 10 s
	failures := 0
	for i := range polls {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		mem := int64(i%100+1) << 20
		if i == 12345 {
			mem = 70 << 30 // one spike, days before the write that succeeds
		}
		o.sample(now, []unclaimedProcess{{UUID: "GPU-0", PodUID: podC, ProcessUsage: gpu.ProcessUsage{PID: 7, MemoryBytes: mem, SMPercent: 30}}}, func() []int { return nil })
		if err := o.publishIfDue(ctx, now); err != nil {
			failures++
		}
		if n := o.uses[observedKey{podC, "GPU-0"}].window.Len(); n > maxWindowSamples {
			t.Fatalf("poll %d: %d samples kept; want at most %d", i, n, maxWindowSamples)
		}
	}
	if failures != polls/30-1 {
		t.Fatalf("%d writes failed; want one per report interval, %d", failures, polls/30-1)
	}
	failing = false
	end := t0.Add(polls * 10 * time.Second)
	if err := o.publishIfDue(ctx, end); err != nil {
		t.Fatal(err)
	}
	u := observedUsage(t, client)
	if u == nil || len(u.Pods) != 1 {
		t.Fatalf("observed %+v; want train-0", u)
	}
	if g := u.Pods[0].GPUs[0].Usage; g.Samples != polls || !g.From.Equal(t0) || !g.To.Equal(end.Add(-10*time.Second)) || g.MemoryMaxBytes != 70<<30 ||
		g.MemoryP95Bytes < 95<<20 || g.MemoryP95Bytes > 97<<20 || g.SMP95Percent != 30 {
		t.Errorf("usage %+v; want %d samples since %s, the 70Gi spike as peak, p95 about 95Mi", g, polls, t0)
	}
}

// A ConfigMap that would pass its size limit leaves out the smallest uses, which stay
// measured for a later write.
func TestObserveFitsTheConfigMapLimit(t *testing.T) {
	var usage configapi.ObservedUsage
	written := map[observedKey]configapi.ShareUsage{}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range 4000 {
		uid := fmt.Sprintf("pod-%04d", i)
		use := configapi.ShareUsage{From: t0, To: t0.Add(5 * time.Minute), Samples: 30, MemoryMaxBytes: int64(i+1) << 20, MemoryP95Bytes: int64(i) << 20}
		usage.Pods = append(usage.Pods, configapi.ObservedPod{Namespace: "ns", Name: uid, UID: uid, GPUs: []configapi.ObservedGPU{{UUID: "GPU-0", Device: "gpu-0", Usage: use}}})
		written[observedKey{uid, "GPU-0"}] = use
	}
	dropped := fitObserved(&usage, written, maxObservedBytes)
	raw, _ := json.Marshal(usage)
	if len(raw) > maxObservedBytes || len(dropped) == 0 || len(usage.Pods)+len(dropped) != 4000 || len(written) != len(usage.Pods) {
		t.Fatalf("%d bytes, %d pods kept, %d left out, %d written; want under %d bytes, every pod kept or left out", len(raw), len(usage.Pods), len(dropped), len(written), maxObservedBytes)
	}
	for _, k := range dropped {
		if k.podUID >= usage.Pods[0].UID {
			t.Errorf("%s left out before %s, which used less", k.podUID, usage.Pods[0].UID)
			break
		}
	}
	small := configapi.ObservedUsage{Pods: usage.Pods[:10]}
	if dropped := fitObserved(&small, written, maxObservedBytes); len(dropped) != 0 || len(small.Pods) != 10 {
		t.Errorf("a small ConfigMap lost %d entries", len(dropped))
	}
}

// One namespace churning pods on the node cannot push another's small uses out of the
// ConfigMap: the namespace with the most entries loses its own first.
func TestObserveLimitTakesFromTheLargestNamespaceFirst(t *testing.T) {
	var usage configapi.ObservedUsage
	written := map[observedKey]configapi.ShareUsage{}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	add := func(ns, uid string, peak int64) {
		use := configapi.ShareUsage{From: t0, To: t0.Add(5 * time.Minute), Samples: 30, MemoryMaxBytes: peak, MemoryP95Bytes: peak}
		usage.Pods = append(usage.Pods, configapi.ObservedPod{Namespace: ns, Name: uid, UID: uid, GPUs: []configapi.ObservedGPU{{UUID: "GPU-0", Device: "gpu-0", Usage: use}}})
		written[observedKey{uid, "GPU-0"}] = use
	}
	for i := range 4000 {
		add("churn", fmt.Sprintf("churn-%04d", i), 70<<30) // large peaks
	}
	for i := range 20 {
		add("quiet", fmt.Sprintf("quiet-%02d", i), 1<<30) // the smallest uses
	}
	dropped := fitObserved(&usage, written, maxObservedBytes)
	if len(dropped) == 0 {
		t.Fatal("nothing left out: nothing to test")
	}
	for _, k := range dropped {
		if strings.HasPrefix(k.podUID, "quiet") {
			t.Fatalf("%s left out while the churning namespace kept %d entries", k.podUID, len(usage.Pods)-20)
		}
	}
}
