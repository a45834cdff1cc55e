package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/gang"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// islandGPUs is the fake fleet of the topology tests: one node of eight GPUs wired as two
// NVLink islands of four, each island under its own PCIe root.
const islandGPUs = "kubeletPlugin.gpus=fake:8xH100-80GB/nvlink-2x4"

// onIslands reinstalls the chart on the eight-GPU node for one test, and the suite's fleet
// after it (registered first, so it runs after the test's namespaces are gone).
func onIslands(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := cluster.Install(ctx, append(slices.Clone(suiteValues), islandGPUs)...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cluster.Install(context.Background(), suiteValues...); err != nil {
			t.Errorf("reinstall the suite's GPUs: %v", err)
		}
	})
}

// islandOf maps each of the node's devices to its NVLink island, as its ResourceSlice says.
func islandOf(t *testing.T) map[string]string {
	t.Helper()
	list, err := cluster.Client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: "spec.driver=" + framework.Driver + ",spec.nodeName=" + cluster.Node})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if a, ok := d.Attributes[api.AttributeNVLinkIsland]; ok && a.StringValue != nil {
				out[d.Name] = *a.StringValue
			}
		}
	}
	if len(out) != 8 {
		t.Fatalf("islands %v: want eight GPUs with an island each", out)
	}
	return out
}

func matchIsland() resourceapi.DeviceConstraint {
	return resourceapi.DeviceConstraint{MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(api.DriverName + "/" + string(api.AttributeNVLinkIsland)))}
}

// devicesOf lists the devices a pod's claim was given.
func devicesOf(t *testing.T, ns, name string) []string {
	t.Helper()
	pod, err := cluster.WaitRunning(context.Background(), ns, name, 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	_, claim := gpuOf(t, pod)
	var out []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

// takeWhole runs n pods in ns that each take a whole GPU whose index selector allows.
func takeWhole(t *testing.T, ns string, n int, selector string) {
	t.Helper()
	for i := range n {
		p := framework.MakeGPUPod(ns, fmt.Sprintf("whole-%d", i)).Class(api.DeviceClassExclusive).Selector(selector)
		if _, err := cluster.Create(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		devicesOf(t, ns, fmt.Sprintf("whole-%d", i))
	}
}

// A claim for two whole GPUs that must share an NVLink island gets two GPUs of one island
// in allocator mode, though the lowest free GPUs lie in two; one for three, which the free
// GPUs hold but no island does, waits and is told why, with nothing allocated.
func TestMatchAttributeKeepsAClaimsGPUsInOneIsland(t *testing.T) {
	onIslands(t)
	island := islandOf(t)
	ctx := context.Background()
	ns := cluster.Namespace(t, "island")
	// gpu-1 to gpu-3 taken: gpu-0 is the first island's last free GPU.
	takeWhole(t, ns, 3, `device.attributes["gpu.fgpu.dev"].index >= 1 && device.attributes["gpu.fgpu.dev"].index <= 3`)
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "pair").Class(api.DeviceClassExclusive).Count(2).Constraint(matchIsland())); err != nil {
		t.Fatal(err)
	}
	got := devicesOf(t, ns, "pair")
	if len(got) != 2 || island[got[0]] != island[got[1]] {
		t.Fatalf("pair got %v on islands %s and %s: want two GPUs of one island", got, island[got[0]], island[got[len(got)-1]])
	}
	pod, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "three").Class(api.DeviceClassExclusive).Count(3).Constraint(matchIsland()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, ns, "three", "in one gpu.fgpu.dev/nvlinkIsland (matchAttribute)", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation != nil {
		t.Fatalf("three GPUs of one island allocated where no island has three free: %+v", claim.Status.Allocation.Devices.Results)
	}
	checkInvariant(t)
}

// Shares go where they break no free island: with three GPUs of one island taken, a share
// takes that island's last GPU, not one of the free island, so a four-GPU claim that must
// stay in one island still finds one.
func TestSharesKeepOffTheIslandAFourGPUClaimNeeds(t *testing.T) {
	onIslands(t)
	island := islandOf(t)
	ctx := context.Background()
	ns := cluster.Namespace(t, "keep")
	// Three whole GPUs of the second island (gpu-4 to gpu-7), chosen by index.
	takeWhole(t, ns, 3, `device.attributes["gpu.fgpu.dev"].index >= 4`)
	share := cluster.Namespace(t, "share")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(share, "share").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	got := devicesOf(t, share, "share")
	if island[got[0]] != island["gpu-4"] {
		t.Errorf("the share went to %s (island %s), breaking the free island; want the island of gpu-4 (%s)", got[0], island[got[0]], island["gpu-4"])
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "four").Class(api.DeviceClassExclusive).Count(4).Constraint(matchIsland())); err != nil {
		t.Fatal(err)
	}
	four := devicesOf(t, ns, "four")
	for _, d := range four {
		if island[d] != island[four[0]] {
			t.Fatalf("four got %v: not one island", four)
		}
	}
	checkInvariant(t)
}

// The second pod of a gang (here a JobSet's) lands on a node of the block its first pod
// runs in, though the placement core alone would pick another block's node. The other
// nodes are Node objects with published GPUs and no kubelet: placement, not running, is
// what this checks.
func TestGangPodsLandInOneBlock(t *testing.T) {
	const block = "network.topology.nvidia.com/block"
	ctx := context.Background()
	ns := cluster.Namespace(t, "gang")
	o := loadgen.Options{Nodes: 2, GPUsPerNode: 1, GPUMemory: "80Gi", Namespace: ns, Prefix: "gang", Driver: framework.Driver, Class: api.DeviceClassShared}
	if err := loadgen.Setup(ctx, cluster.Client, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = loadgen.Cleanup(context.Background(), cluster.Client, o) })
	// The core puts a share on the emptier block-b2 node first: it sorts first by name.
	labelNode(t, o.NodeName(0), block, "b2")
	labelNode(t, o.NodeName(1), block, "b1")
	labelNode(t, cluster.Node, block, "b1")

	first := framework.MakeGPUPod(ns, "worker-0").Class(api.DeviceClassExclusive).Count(2).Label(gang.LabelJobSet, "train")
	if _, err := cluster.Create(ctx, first); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "worker-0", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	second := framework.MakeGPUPod(ns, "worker-1").Memory("10Gi").Label(gang.LabelJobSet, "train")
	pod := second.Pod()
	pod.Spec.Tolerations = []corev1.Toleration{{Operator: corev1.TolerationOpExists}} // the kubelet-less nodes never report Ready
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, second.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cluster.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var claim *resourceapi.ResourceClaim
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		claim, err = cluster.ClaimOf(ctx, p)
		return err == nil && claim.Status.Allocation != nil, nil
	})
	if err != nil {
		t.Fatalf("worker-1's claim not allocated: %v", err)
	}
	if got := claim.Status.Allocation.Devices.Results[0].Pool; got != o.NodeName(1) {
		t.Fatalf("worker-1 placed on %s; want %s, the free node in worker-0's block b1", got, o.NodeName(1))
	}
}

// labelNode sets a label on a node until the test ends.
func labelNode(t *testing.T, node, k, v string) {
	t.Helper()
	patch := func(value any) error {
		body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{k: value}}})
		_, err := cluster.Client.CoreV1().Nodes().Patch(context.Background(), node, types.MergePatchType, body, metav1.PatchOptions{})
		return err
	}
	if err := patch(v); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = patch(nil) })
}
