package kueue

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

// Issue #24: Kueue charges what claims ask, not the free room they keep from other
// namespaces. Under a SharingPolicy with quota.heldRoom: Refuse and no fgpu memory quota (as
// docs/kueue.md advises), a tenant's two admitted Jobs of 1Gi in two isolation sub-domains do
// not hold two GPUs: Kueue counts 2Gi, the second waits in fgpu, saying why, and another
// team's Job gets the GPU left alone. (That the second is placed once the first is gone is
// pkg/controller's TestRefusedHeldRoomKeepsANamespaceToOneGPU.)
func TestHeldRoomAgreesWithKueuesCharge(t *testing.T) {
	ctx := context.Background()
	nsA, nsB := queues(t, "20Gi")
	fgpu, err := versioned.NewForConfig(cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	pol := builders.MakePolicy("e2e-kueue-held-room").Namespaces("kubernetes.io/metadata.name", nsA).RefuseHeldRoom().Obj()
	if _, err := fgpu.FgpuV1alpha1().SharingPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fgpu.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), pol.Name, metav1.DeleteOptions{})
	})
	time.Sleep(time.Second) // the allocator's informer

	tn := cluster.Tenant(t, nsA, "tenant")
	domain := func(d string) map[string]any { return map[string]any{"isolationDomain": d} }
	gpuJob(t, tn.Client, framework.MakeGPUPod(nsA, "d0").Memory("1Gi").Config(domain("d0")), "gpus")
	admitted(t, nsA, "d0")
	first := placed(t, nsA, "d0")
	gpuJob(t, tn.Client, framework.MakeGPUPod(nsA, "d1").Memory("1Gi").Config(domain("d1")), "gpus")
	admitted(t, nsA, "d1")
	waitUsage(t, "e2e-team-a", "2Gi", "0")
	status := waitPendingStatus(t, nsA, "d1", "heldRoom: Refuse", "SharingPolicy e2e-kueue-held-room")
	t.Logf("KUEUE admitted %s/d1 (ClusterQueue e2e-team-a uses 2Gi); fgpu keeps it off a second GPU: %s", nsA, status)

	gpuJob(t, cluster.Client, framework.MakeGPUPod(nsB, "b1").Memory("10Gi"), "gpus")
	admitted(t, nsB, "b1")
	if other := placed(t, nsB, "b1"); other.device == first.device {
		t.Errorf("another team's Job shares %s with the tenant's isolation domain", other.device)
	} else {
		t.Logf("PLACED %s/b1 on %s, the GPU %s/d1 would have kept", nsB, other.device, nsA)
	}

}

// waitPendingStatus waits until the claim of the Job's only pod is unallocated and fgpu's
// status of it says every one of substrs, and returns the status.
func waitPendingStatus(t *testing.T, ns, job string, substrs ...string) string {
	t.Helper()
	var msg string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		pods := jobPods(t, ns, job)
		if len(pods) != 1 {
			return false, nil
		}
		claim, err := cluster.ClaimOf(ctx, &pods[0])
		if err != nil {
			return false, nil
		}
		if claim.Status.Allocation != nil {
			t.Fatalf("job %s/%s: claim %s allocated %+v, want it to wait", ns, job, claim.Name, claim.Status.Allocation.Devices.Results)
		}
		msg = claim.Annotations[api.AnnotationStatus]
		for _, s := range substrs {
			if !strings.Contains(msg, s) {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("job %s/%s: claim status %q does not say %q", ns, job, msg, substrs)
	}
	return msg
}
