package controller

import (
	"encoding/json"

	corev1 "k8s.io/api/core/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// observeForeign takes what a node's kubelet plugin measured of the GPU pods fgpu did not
// place (observe mode: NVIDIA's device plugin's pods, before fgpu serves them) into the
// same sizing histories as the claims' use, and tells the recommendations on the pods.
// The ConfigMap is trusted as the plugins' word: tenants cannot write the chart's
// namespace, and the chart's admission policy keeps each plugin to its own node's. A pod
// counts only where it still runs on that node under the UID measured.
//
// Such a pod's workload is sized under the request name of the claims fgpu gives pods that
// ask for the extended resource (api.ExtendedResourceRequest), so that once fgpu serves
// the workload, its measured history sizes its claims. The event says what the sizing mode
// would do then, not now: fgpu cannot resize a pod it did not place.
func (s *sizingLoop) observeForeign(cm *corev1.ConfigMap) {
	if s.sizer == nil {
		return
	}
	node := cm.Labels[api.LabelObservedUsage]
	if node == "" || cm.Name != api.ObservedUsagePrefix+node {
		return
	}
	var u api.ObservedUsage
	if json.Unmarshal([]byte(cm.Data[api.ObservedUsageKey]), &u) != nil || u.Node != node {
		return
	}
	for _, op := range u.Pods {
		pod, err := s.pods.Pods(op.Namespace).Get(op.Name)
		if err != nil || string(pod.UID) != op.UID || pod.Spec.NodeName != node || pod.Namespace == s.cfg.Namespace {
			continue
		}
		top := topOwner(pod)
		w := api.SizingWorkload{Namespace: pod.Namespace, Kind: top.Kind, Name: top.Name, Request: api.ExtendedResourceRequest}
		mode := s.policyOf(pod.Namespace, pod).Sizing
		var changed []api.SizingRecord
		s.sizer.mu.Lock()
		added := false
		for _, g := range op.GPUs {
			added = s.sizer.rec.Add(w, "observed/"+op.UID+"/"+g.UUID, g.Usage) || added
		}
		if added {
			if r, ok := s.announce(w, mode); ok {
				changed = append(changed, r)
			}
		}
		s.sizer.mu.Unlock()
		s.tell(pod, changed, mode, observedEffect[mode])
	}
}
