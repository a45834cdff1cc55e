package allocator

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/controller"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// createPolicy creates a SharingPolicy for the duration of the test, labelled for
// deletePolicies.
func createPolicy(t *testing.T, p *api.SharingPolicy) {
	t.Helper()
	ctx := context.Background()
	p.Labels = map[string]string{"fgpu.dev/e2e": "true"}
	if _, err := fgpuClient.FgpuV1alpha1().SharingPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fgpuClient.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), p.Name, metav1.DeleteOptions{})
	})
	time.Sleep(time.Second) // the allocator's informer
}

func deletePolicies(ctx context.Context) {
	_ = fgpuClient.FgpuV1alpha1().SharingPolicies().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "fgpu.dev/e2e=true"})
}

// gpuOf returns the device of the pod's claim once the allocator placed it.
func gpuOf(t *testing.T, pod *corev1.Pod) (string, *resourceapi.ResourceClaim) {
	t.Helper()
	claim, err := cluster.ClaimOf(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	if !controller.PlacedByAllocator(framework.Driver, claim) {
		t.Fatalf("claim %s not placed by the allocator: %v", claim.Name, claim.Annotations[api.AnnotationStatus])
	}
	return claim.Status.Allocation.Devices.Results[0].Device, claim
}

// checkInvariant checks every fgpu allocation in the cluster.
func checkInvariant(t *testing.T) {
	t.Helper()
	if err := loadgen.Check(context.Background(), cluster.Client, framework.Driver); err != nil {
		t.Fatalf("invariant: %v", err)
	}
}

// waitPending checks a pod stays unscheduled for a while.
func waitPending(t *testing.T, ns, name string, d time.Duration) {
	t.Helper()
	time.Sleep(d)
	p, err := cluster.Client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.NodeName != "" {
		t.Fatalf("pod %s/%s was scheduled to %s", ns, name, p.Spec.NodeName)
	}
}

// allocatorPIDs are the host PIDs of fgpu-allocator processes (it runs on the host network
// of the one real node, so its process is visible here).
func allocatorPIDs() []int {
	var pids []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err == nil && strings.HasPrefix(string(cmdline), "/usr/bin/fgpu-allocator\x00") {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAllocator(t *testing.T) {
	t.Helper()
	pids := allocatorPIDs()
	if len(pids) == 0 {
		t.Fatal("no fgpu-allocator process on this host")
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
}
