package gang

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func pod(labels map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "p", Labels: labels}}
}

func TestOf(t *testing.T) {
	grouped := pod(map[string]string{LabelJobSet: "js"})
	grouped.Spec.SchedulingGroup = &corev1.PodSchedulingGroup{PodGroupName: ptr.To("pg")}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"none", pod(nil), ""},
		{"scheduling group wins over labels", grouped, "t/podgroup/pg"},
		{"coscheduling", pod(map[string]string{LabelPodGroup: "g"}), "t/pod-group/g"},
		{"kueue pod group", pod(map[string]string{LabelKueuePodGroup: "g"}), "t/kueue-pod-group/g"},
		{"jobset", pod(map[string]string{LabelJobSet: "js", "batch.kubernetes.io/job-name": "js-w-0"}), "t/jobset/js"},
		{"a plain Job's pods are no gang", pod(map[string]string{"batch.kubernetes.io/job-name": "j", "batch.kubernetes.io/job-completion-index": "3"}), ""},
	} {
		if got := Of(tc.pod); got != tc.want {
			t.Errorf("%s: Of = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func node(labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
}

func TestLevels(t *testing.T) {
	keys := []string{"rack", "block", "zone"}
	members := []*corev1.Node{
		node(map[string]string{"rack": "r2", "block": "b1"}),
		node(map[string]string{"rack": "r1", "block": "b1"}),
		node(map[string]string{"block": "b2"}),
	}
	want := []Level{{"rack", "r1"}, {"block", "b1"}}
	if got := Levels(keys, members); !slices.Equal(got, want) {
		t.Errorf("Levels = %v, want %v (majority, ties to the smaller value, unlabelled keys left out)", got, want)
	}
	if got := Levels(keys, nil); got != nil {
		t.Errorf("Levels of no member = %v, want none", got)
	}
}
