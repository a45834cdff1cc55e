package controller

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// observedMap is a kubelet plugin's observed-usage ConfigMap in namespace ns, named for
// node and labelled for label, naming pods by namespace, name and UID.
func observedMap(ns, node, label string, pods ...*corev1.Pod) *corev1.ConfigMap {
	u := api.ObservedUsage{Node: node}
	for _, p := range pods {
		u.Pods = append(u.Pods, api.ObservedPod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), GPUs: []api.ObservedGPU{{
			UUID: "GPU-1", Device: "gpu-1", Usage: api.ShareUsage{From: builders.Created.Time, To: builders.Created.Add(5 * time.Minute), Samples: 200,
				MemoryMaxBytes: 5 << 30, MemoryP95Bytes: 4 << 30, MemoryMeanBytes: 3 << 30, SMSamples: 200, SMMaxPercent: 40, SMP95Percent: 30, SMMeanPercent: 20}}}})
	}
	raw, _ := json.Marshal(u)
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: api.ObservedUsagePrefix + node, Labels: map[string]string{api.LabelObservedUsage: label}},
		Data: map[string]string{api.ObservedUsageKey: string(raw)}}
}

// What a plugin measured of a pod fgpu did not place gives the pod's workload a
// recommendation, told on the pod without an effect fgpu cannot have on it; the same written where the plugins do not write (a
// tenant's namespace), for another node, or for a pod of another UID gives none.
func TestObservedPodsAreSized(t *testing.T) {
	measured := builders.MakePod("team", "device-plugin-pod").Bound("n1").Obj()
	forged := builders.MakePod("team", "forged").Bound("n1").Obj()
	elsewhere := builders.MakePod("team", "elsewhere").Bound("n1").Obj()
	stale := builders.MakePod("team", "stale").Bound("n1").Obj()
	staleEntry := stale.DeepCopy()
	staleEntry.UID = "an-earlier-pod"
	objs := []runtime.Object{builders.MakeNode("n1").Obj(), measured, forged, elsewhere, stale,
		observedMap("fgpu-system", "n1", "n1", measured, staleEntry),
		observedMap("team", "n1", "n1", forged),
		observedMap("fgpu-system", "n2", "n1", elsewhere),
	}
	e := newEnvWith(t, func(c *Config) { c.Namespace = "fgpu-system" }, []*api.SharingPolicy{builders.MakePolicy("auto").Sizing(api.SizingAuto).Obj()}, objs...)
	e.run()
	got := e.awaitEvents("recommended memory", 1)
	if len(got) != 1 || !strings.Contains(got[0], "Pod team/device-plugin-pod request gpu") {
		t.Fatalf("recommendation events %q: want one, for team/device-plugin-pod", got)
	}
	// Sizing auto cannot resize a pod fgpu did not place: the event says so, not that it evicts.
	if !strings.Contains(got[0], "sizing Auto: nothing is changed for this pod, which fgpu does not serve") || strings.Contains(got[0], "evicted") {
		t.Errorf("event %q: want no effect claimed on a pod fgpu does not serve", got[0])
	}
	for _, who := range []string{"forged", "elsewhere", "stale"} {
		if ev := e.events("/" + who + " request"); len(ev) > 0 {
			t.Errorf("%s was sized: %q", who, ev)
		}
	}
}
