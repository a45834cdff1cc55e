package v1alpha1

import (
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cronJobRun matches the name the CronJob controller gives a Job: the CronJob's name and its
// scheduled time in minutes.
var cronJobRun = regexp.MustCompile(`^(.+)-[0-9]{8,}$`)

// WorkloadOf is the SizingWorkload a pod's claim request belongs to: the pod's top owner,
// from its controller reference and the names Kubernetes' controllers give what they create,
// without reading the owners (a ReplicaSet named <deployment>-<pod-template-hash> is its
// Deployment's, a Job named <cronjob>-<minutes> its CronJob's), or the pod itself. All of it
// is the tenant's to write, which only ever moves its pods among the workloads of its own
// namespace. The allocator's recommendations and `fgpu report` name workloads by it, so
// that a report finds the recommendation of each claim it counts.
func WorkloadOf(pod *corev1.Pod, request string) SizingWorkload {
	w := SizingWorkload{Namespace: pod.Namespace, Kind: "Pod", Name: pod.Name, Request: request}
	ref := metav1.GetControllerOf(pod)
	if ref == nil {
		return w
	}
	w.Kind, w.Name = ref.Kind, ref.Name
	switch ref.Kind {
	case "ReplicaSet":
		if h := pod.Labels["pod-template-hash"]; h != "" && strings.HasSuffix(ref.Name, "-"+h) {
			w.Kind, w.Name = "Deployment", strings.TrimSuffix(ref.Name, "-"+h)
		}
	case "Job":
		if m := cronJobRun.FindStringSubmatch(ref.Name); m != nil {
			w.Kind, w.Name = "CronJob", m[1]
		}
	}
	return w
}
