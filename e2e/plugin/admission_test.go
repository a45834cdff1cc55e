package plugin

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// pluginOn is a client that acts as the plugin's service account with a token bound to node.
func pluginOn(t *testing.T, node string) kubernetes.Interface {
	cfg := rest.CopyConfig(cluster.Config)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + framework.Namespace + ":fgpu-kubelet-plugin",
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + framework.Namespace, "system:authenticated"},
		Extra:    map[string][]string{"authentication.kubernetes.io/node-name": {node}},
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slice(name, node string) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: framework.Driver, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
}

// policyInForce waits (bounded) until a dry run of create is refused: the API server
// enforces an admission policy a moment after the chart (re)created it.
func policyInForce(t *testing.T, create func(metav1.CreateOptions) error) {
	t.Helper()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	_ = wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return create(dryRun) != nil, nil
	})
}

// A plugin may write its own node's ResourceSlices only.
func TestPluginWritesOnlyItsOwnNodesSlices(t *testing.T) {
	ctx := context.Background()
	other := pluginOn(t, "some-other-node")
	policyInForce(t, func(opts metav1.CreateOptions) error {
		_, err := other.ResourceV1().ResourceSlices().Create(ctx, slice("fgpu-e2e-intruder", cluster.Node), opts)
		return err
	})
	_, err := other.ResourceV1().ResourceSlices().Create(ctx, slice("fgpu-e2e-intruder", cluster.Node), metav1.CreateOptions{})
	if err == nil {
		if err := cluster.Client.ResourceV1().ResourceSlices().Delete(ctx, "fgpu-e2e-intruder", metav1.DeleteOptions{}); err != nil {
			t.Errorf("removing the intruding slice: %v", err)
		}
		t.Fatal("a plugin on another node created this node's slice")
	}
	if !strings.Contains(err.Error(), "may only write its own node's ResourceSlices, not those of node "+cluster.Node) {
		t.Fatalf("refused, but not with the policy's message: %v", err)
	}
	own, err := other.ResourceV1().ResourceSlices().Create(ctx, slice("fgpu-e2e-own", "some-other-node"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a plugin could not write its own node's slice: %v", err)
	}
	if err := other.ResourceV1().ResourceSlices().Delete(ctx, own.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("a plugin could not delete its own node's slice: %v", err)
	}
	slices, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + cluster.Node})
	if err != nil || len(slices.Items) == 0 {
		t.Fatalf("no slice of this node: %v", err)
	}
	if err := other.ResourceV1().ResourceSlices().Delete(ctx, slices.Items[0].Name, metav1.DeleteOptions{}); err == nil {
		t.Fatal("a plugin on another node deleted this node's slice")
	}
}
