package adoption

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// A pod holds the most of the resource its containers hold at once: its containers' sum
// with its sidecars', or an init container's with the sidecars started before it.
func TestAsked(t *testing.T) {
	gpus := func(n int64, limit bool) corev1.ResourceRequirements {
		l := corev1.ResourceList{DefaultExtendedResource: *resource.NewQuantity(n, resource.DecimalSI)}
		if limit {
			return corev1.ResourceRequirements{Limits: l}
		}
		return corev1.ResourceRequirements{Requests: l}
	}
	always := corev1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name       string
		init, main []corev1.Container
		want       int64
	}{
		{"none", nil, []corev1.Container{{}}, 0},
		{"limits summed", nil, []corev1.Container{{Resources: gpus(1, true)}, {Resources: gpus(2, true)}}, 3},
		{"a request without a limit", nil, []corev1.Container{{Resources: gpus(2, false)}}, 2},
		{"an init container asking more", []corev1.Container{{Resources: gpus(4, true)}}, []corev1.Container{{Resources: gpus(1, true)}}, 4},
		{"a sidecar beside the rest", []corev1.Container{{Resources: gpus(1, true), RestartPolicy: &always}, {Resources: gpus(2, true)}},
			[]corev1.Container{{Resources: gpus(1, true)}}, 3},
	} {
		p := &corev1.Pod{Spec: corev1.PodSpec{InitContainers: tc.init, Containers: tc.main}}
		if got := asked(p, DefaultExtendedResource); got != tc.want {
			t.Errorf("%s: %d; want %d", tc.name, got, tc.want)
		}
	}
}
