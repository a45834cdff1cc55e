package plugin

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/admission"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// The plugin may write the observe mode ConfigMap it makes for its own node, and no other:
// else one node's plugin could make up the use the allocator sizes another node's pods by.
func TestObservedUsagePolicyAdmitsOnlyItsNodesConfigMap(t *testing.T) {
	p, _ := admission.Only(t, "observed-usage-admission.yaml")
	admission.Compile(t, p)
	ctx := context.Background()
	client := k8sfake.NewClientset()
	o := newObserver(client, node, observeNS, []gpu.Device{{Index: 1, UUID: "GPU-1"}}, time.Minute, time.Hour)
	o.pods = podLister(t, observedPod("ml", "train-0", podC))
	o.sample(time.Unix(0, 0), []unclaimedProcess{{UUID: "GPU-1", PodUID: podC, ProcessUsage: gpu.ProcessUsage{PID: 1, MemoryBytes: 1 << 30, SMPercent: 10}}}, func() []int { return nil })
	if err := o.publishIfDue(ctx, time.Unix(60, 0)); err != nil {
		t.Fatal(err)
	}
	made, err := client.CoreV1().ConfigMaps(observeNS).Get(ctx, configapi.ObservedUsagePrefix+node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	toMap := func(c *corev1.ConfigMap) map[string]any {
		t.Helper()
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(c)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	cm := toMap(made)
	renamed := made.DeepCopy()
	renamed.Name = configapi.ObservedUsagePrefix + "node-b"
	other := toMap(renamed)
	stripped := made.DeepCopy()
	stripped.Labels = nil
	unlabelled := toMap(stripped)
	refusal := func(operation, onNode string, cm map[string]any) string {
		t.Helper()
		request := map[string]any{"operation": operation, "userInfo": map[string]any{"username": admission.PluginUser,
			"extra": map[string]any{"authentication.kubernetes.io/node-name": []any{onNode}}}}
		var old map[string]any
		if operation == "UPDATE" {
			old = cm
		}
		if !admission.Matches(t, p, request, cm, old) {
			t.Fatal("the policy does not apply to the plugin")
		}
		return admission.Validate(t, p, request, cm, old)
	}
	for _, op := range []string{"CREATE", "UPDATE"} {
		if msg := refusal(op, node, cm); msg != "" {
			t.Errorf("%s of the ConfigMap the plugin makes for its own node is refused: %s", op, msg)
		}
		if refusal(op, "node-b", cm) == "" {
			t.Errorf("%s of node %s's ConfigMap by node-b's plugin is admitted", op, node)
		}
		if refusal(op, node, other) == "" {
			t.Errorf("%s of node-b's ConfigMap by %s's plugin is admitted", op, node)
		}
		if refusal(op, node, unlabelled) == "" {
			t.Errorf("%s of an unlabelled ConfigMap is admitted", op)
		}
	}
	if refusal("CREATE", "", cm) == "" {
		t.Error("a plugin whose token names no node is admitted")
	}
}
