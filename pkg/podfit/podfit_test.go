package podfit

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func node() *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n", Labels: map[string]string{"zone": "a"}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"),
			corev1.ResourceMemory: resource.MustParse("8Gi"), corev1.ResourcePods: resource.MustParse("10")}}}
}

func pod(cpu string) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("3500m")}}}},
		Containers:     []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
}

func TestFits(t *testing.T) {
	n := node()
	if err := Fits(pod("1"), n, Requests{}); err != nil {
		t.Fatal(err)
	}
	// The init container's 3.5 CPU counts, as in kube-scheduler.
	if err := Fits(pod("1"), n, Requests{MilliCPU: 1000}); err == nil || !strings.Contains(err.Error(), "insufficient cpu") {
		t.Errorf("want insufficient cpu, got %v", err)
	}
	p := pod("1")
	p.Spec.NodeSelector = map[string]string{"zone": "b"}
	if err := Fits(p, n, Requests{}); err == nil || !strings.Contains(err.Error(), "affinity/selector") {
		t.Errorf("want selector mismatch, got %v", err)
	}
	n.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "x", Effect: corev1.TaintEffectNoSchedule}}
	if err := Fits(pod("1"), n, Requests{}); err == nil || !strings.Contains(err.Error(), "untolerated taint") {
		t.Errorf("want taint, got %v", err)
	}
	p = pod("1")
	p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	if err := Fits(p, n, Requests{}); err != nil {
		t.Errorf("tolerated taint refused: %v", err)
	}
	n.Spec.Unschedulable = true
	if err := Fits(p, n, Requests{}); err == nil || !strings.Contains(err.Error(), "unschedulable") {
		t.Errorf("want unschedulable, got %v", err)
	}
	if err := Fits(pod("1"), node(), Requests{Pods: 10}); err == nil || !strings.Contains(err.Error(), "too many pods") {
		t.Errorf("want too many pods, got %v", err)
	}
}

// Pods that differ only in what they request share node verdicts; any difference in what
// FitsNode reads gives another key.
func TestConstraintsKey(t *testing.T) {
	a, b := NewChecker(pod("1")), NewChecker(pod("2"))
	if a.ConstraintsKey() != b.ConstraintsKey() {
		t.Error("requests changed the key")
	}
	p := pod("1")
	p.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	q := pod("1")
	q.Spec.NodeSelector = map[string]string{"zone": "a"}
	r := pod("1")
	r.Spec.Affinity = &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	seen := map[string]bool{a.ConstraintsKey(): true}
	for _, x := range []*corev1.Pod{p, q, r} {
		k := NewChecker(x).ConstraintsKey()
		if seen[k] {
			t.Errorf("constraints %v share a key with another pod", x.Spec)
		}
		seen[k] = true
	}
}
