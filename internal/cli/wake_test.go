package cli

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

func TestWake(t *testing.T) {
	ctx := context.Background()
	scaled := map[string]string{api.AnnotationScaledDownReplicas: "3"}
	client := fake.NewClientset(
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "web", Annotations: scaled}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}},
		&appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "db", Annotations: map[string]string{api.AnnotationScaledDownReplicas: "2"}}, Spec: appsv1.StatefulSetSpec{Replicas: ptr.To[int32](0)}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "plain"}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "up", Annotations: scaled}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](1)}},
		&appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "bad", Annotations: map[string]string{api.AnnotationScaledDownReplicas: "-4"}}, Spec: appsv1.DeploymentSpec{Replicas: ptr.To[int32](0)}})
	if r, err := wake(ctx, client, "a", "deployment", "web"); err != nil || r != 3 {
		t.Fatalf("wake web: %d, %v; want 3", r, err)
	}
	if d, _ := client.AppsV1().Deployments("a").Get(ctx, "web", metav1.GetOptions{}); *d.Spec.Replicas != 3 {
		t.Errorf("web has %d replicas after wake; want 3", *d.Spec.Replicas)
	}
	if r, err := wake(ctx, client, "a", "sts", "db"); err != nil || r != 2 {
		t.Fatalf("wake db: %d, %v; want 2", r, err)
	}
	if s, _ := client.AppsV1().StatefulSets("a").Get(ctx, "db", metav1.GetOptions{}); *s.Spec.Replicas != 2 {
		t.Errorf("db has %d replicas after wake; want 2", *s.Spec.Replicas)
	}
	for name, want := range map[string]string{"plain": "was not scaled down by fgpu", "up": "already has 1 replicas", "bad": "is not a replica count"} {
		if _, err := wake(ctx, client, "a", "deployment", name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("wake %s: %v; want an error with %q", name, err, want)
		}
	}
	if _, err := wake(ctx, client, "a", "job", "x"); err == nil {
		t.Error("wake job/x did not fail")
	}
}
