package v1alpha1

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// The allocator's recommendations (its topOwner) and fgpu report both name a pod's workload by
// WorkloadOf.
func TestWorkloadOf(t *testing.T) {
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
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", Labels: tc.labels}}
		if tc.kind != "" {
			p.OwnerReferences = []metav1.OwnerReference{{Kind: tc.kind, Name: tc.owner, Controller: ptr.To(true)}}
		}
		got := WorkloadOf(p, "gpu")
		if got.Kind+"/"+got.Name != tc.want || got.Namespace != "ns" || got.Request != "gpu" {
			t.Errorf("%s %s: %+v, want %s in ns, request gpu", tc.kind, tc.owner, got, tc.want)
		}
	}
}
