package extendedresource

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// podWith is a pod as the admission policy leaves it: labelled, naming templates per claim.
func podWith(name string, templates ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: name,
		Labels: map[string]string{api.LabelExtendedResource: "true"}}}
	for i, t := range templates {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{
			Name: api.ExtendedResourcePodClaimPrefix + string(rune('0'+i)), ResourceClaimTemplateName: &t})
	}
	return p
}

func start(t *testing.T, objs ...runtime.Object) (*fake.Clientset, *record.FakeRecorder) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	client := fake.NewClientset(objs...)
	rec := record.NewFakeRecorder(10)
	k := NewTemplateKeeper(client, rec, "nvidia.com/gpu", api.DeviceClassShared)
	done := make(chan struct{})
	go func() { _ = k.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return client, rec
}

func template(t *testing.T, client *fake.Clientset, name string) *resourceapi.ResourceClaimTemplate {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if got, err := client.ResourceV1().ResourceClaimTemplates("team-a").Get(context.Background(), name, metav1.GetOptions{}); err == nil {
			return got
		}
	}
	return nil
}

func TestKeeperMakesTheTemplateAPodNames(t *testing.T) {
	client, _ := start(t, podWith("web", "fgpu-gpu-2"))
	got := template(t, client, "fgpu-gpu-2")
	if got == nil {
		t.Fatal("no template fgpu-gpu-2")
	}
	req := got.Spec.Spec.Devices.Requests
	if len(req) != 1 || req[0].Exactly == nil || req[0].Exactly.Count != 2 || req[0].Exactly.DeviceClassName != api.DeviceClassShared ||
		req[0].Exactly.AllocationMode != resourceapi.DeviceAllocationModeExactCount || req[0].Exactly.Capacity != nil {
		t.Errorf("template asks for %+v, want 2 whole GPUs of %s", req, api.DeviceClassShared)
	}
	if got.Labels[api.LabelExtendedResource] != "true" {
		t.Errorf("template labels %v: the keeper would not see it deleted", got.Labels)
	}

	// Deleted while a pod still waits for its claim: made again.
	if err := client.ResourceV1().ResourceClaimTemplates("team-a").Delete(context.Background(), "fgpu-gpu-2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	if template(t, client, "fgpu-gpu-2") == nil {
		t.Error("a template deleted while a pod waits for it was not made again")
	}
}

func TestKeeperMakesOnlyWhatIsStillNeeded(t *testing.T) {
	made := podWith("made", "fgpu-gpu-1")
	made.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: made.Spec.ResourceClaims[0].Name}}
	done := podWith("done", "fgpu-gpu-3")
	done.Status.Phase = corev1.PodSucceeded
	// A tenant may name any template; the keeper makes only the policy's names, up to 32 GPUs.
	client, _ := start(t, made, done, podWith("odd", "fgpu-gpu-33", "fgpu-gpu-07", "other"), podWith("ok", "fgpu-gpu-4"))
	if template(t, client, "fgpu-gpu-4") == nil {
		t.Fatal("no template for the waiting pod")
	}
	list, err := client.ResourceV1().ResourceClaimTemplates("team-a").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 {
		var names []string
		for _, t := range list.Items {
			names = append(names, t.Name)
		}
		t.Errorf("templates %v, want only fgpu-gpu-4", names)
	}
}

func TestKeeperLeavesTheNamespacesOwnTemplate(t *testing.T) {
	own := Template("team-a", 1, "their.class")
	own.Labels = nil
	client, _ := start(t, own, podWith("web", "fgpu-gpu-1"))
	time.Sleep(200 * time.Millisecond)
	got := template(t, client, "fgpu-gpu-1")
	if got == nil || got.Spec.Spec.Devices.Requests[0].Exactly.DeviceClassName != "their.class" {
		t.Errorf("the namespace's own template was replaced: %+v", got)
	}
}

func TestKeeperTellsThePodWhyItsTemplateIsMissing(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset(podWith("web", "fgpu-gpu-1"))
	client.PrependReactor("create", "resourceclaimtemplates", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaimtemplates"}, "fgpu-gpu-1", nil)
	})
	rec := record.NewFakeRecorder(10)
	go func() { _ = NewTemplateKeeper(client, rec, "nvidia.com/gpu", api.DeviceClassShared).Run(ctx) }()
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, ReasonTemplateFailed) || !strings.Contains(e, "fgpu-gpu-1") || !strings.Contains(e, "nvidia.com/gpu") {
			t.Errorf("event %q does not say which template failed for which request", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no event on the pod")
	}
}

func TestTemplateCount(t *testing.T) {
	for name, want := range map[string]int{"fgpu-gpu-1": 1, "fgpu-gpu-32": 32, "fgpu-gpu-0": 0, "fgpu-gpu-33": 0,
		"fgpu-gpu-01": 0, "fgpu-gpu-+1": 0, "fgpu-gpu-": 0, "gpu-1": 0, "fgpu-gpu-1x": 0} {
		got, ok := TemplateCount(name)
		if got != want || ok != (want > 0) {
			t.Errorf("TemplateCount(%q) = %d, %v; want %d", name, got, ok, want)
		}
	}
}
