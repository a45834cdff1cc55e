package faults

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

// A fatal fault of one isolation domain's MPS server breaks only that server's clients: the
// pods of that namespace on the GPU are moved (evicted, and recreated by their controller),
// while another namespace's pod on the same GPU keeps running, and the GPU is not tainted.
func TestMPSServerFaultMovesOnlyItsDomain(t *testing.T) {
	ctx := context.Background()
	fgpu, err := versioned.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	freshGPUs(t)
	broken, other := cluster.Namespace(t, "mps-broken"), cluster.Namespace(t, "mps-other")
	const key = "fgpu.dev/e2e-faults-mps"
	cluster.LabelNamespace(t, broken, key, "shared")
	cluster.LabelNamespace(t, other, key, "shared")
	policy := builders.MakePolicy("e2e-faults-mps").Priority(10).Namespaces(key, "shared").AllowShared().Obj()
	if _, err := fgpu.FgpuV1alpha1().SharingPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fgpu.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), policy.Name, metav1.DeleteOptions{})
	})
	time.Sleep(time.Second) // the allocator's policy informer

	// One GPU is taken whole, so both namespaces share the other.
	filler := cluster.Namespace(t, "mps-filler")
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(filler, "whole").Class(api.DeviceClassExclusive)); err != nil {
		t.Fatal(err)
	}
	whole, err := cluster.WaitRunning(ctx, filler, "whole", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	wholeClaim, err := cluster.ClaimOf(ctx, whole)
	if err != nil || wholeClaim.Status.Allocation == nil {
		t.Fatalf("the whole-GPU claim: %v", err)
	}
	shared := "gpu-0"
	if wholeClaim.Status.Allocation.Devices.Results[0].Device == "gpu-0" {
		shared = "gpu-1"
	}
	deployment(t, broken, "app", 1, 0)
	before := waitPlaced(t, broken, "app", 1, time.Minute, shared)
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(other, "bystander").Memory("10Gi")); err != nil {
		t.Fatal(err)
	}
	bystander, err := cluster.WaitRunning(ctx, other, "bystander", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := cluster.ClaimOf(ctx, bystander); err != nil || c.Status.Allocation == nil || c.Status.Allocation.Devices.Results[0].Device != shared {
		t.Fatalf("the other namespace's pod is not on %s with the broken one: %v", shared, err)
	}

	// The broken namespace's server goes into FAULT, as NVIDIA's does after a fatal fault.
	var victim string
	for name := range before {
		victim = name
	}
	report, err := cluster.Probe(ctx, broken, victim)
	if err != nil {
		t.Fatal(err)
	}
	logDir := report.Env["CUDA_MPS_LOG_DIRECTORY"]
	if logDir == "" {
		t.Fatalf("%s/%s has no MPS log directory: %v", broken, victim, report.Env)
	}
	fault := filepath.Join(logDir, fakecontrol.FaultFile)
	if err := os.WriteFile(fault, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(fault) })
	injected := time.Now()

	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods(broken).Get(ctx, victim, metav1.GetOptions{})
		return err != nil || p.DeletionTimestamp != nil, nil
	})
	if err != nil {
		t.Fatalf("%s/%s, a client of the faulted server, was not moved within a minute", broken, victim)
	}
	t.Logf("MPS server fault → client evicted in %s", time.Since(injected).Round(100*time.Millisecond))
	if _, err := cluster.WaitEvent(ctx, broken, victim, "Evicted", 10*time.Second); err != nil {
		t.Errorf("no event tells %s/%s why it was moved: %v", broken, victim, err)
	}
	if got := deviceTaints(ctx, shared); len(got) != 0 {
		t.Errorf("one domain's MPS fault tainted the GPU: %v", got)
	}
	p, err := cluster.Client.CoreV1().Pods(other).Get(ctx, "bystander", metav1.GetOptions{})
	if err != nil || p.UID != bystander.UID || p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning {
		t.Errorf("another namespace's pod on the GPU did not keep running: %v %+v", err, p.Status)
	}
}
