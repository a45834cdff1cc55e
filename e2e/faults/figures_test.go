package faults

import (
	"context"
	"maps"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/test/performance/loadgen"
)

// First, a non-fatal condition on the replicas' GPU leaves them running (NoSchedule only).
// Then the figures: over FGPU_FAULT_RUNS (default 10) fault/recover cycles, the time from
// an injected fatal fault to the NoExecute taint, to the eviction of the three replicas on
// that GPU, and to their replacements Running on the other GPU (p50 and max); and the
// capacity leaked after the cycles: the invariant over the live claims and slices, the
// memory the namespace's allocated claims hold (exactly the three replicas' 30Gi), and none
// once the Deployment is gone.
//
//	go test ./e2e/faults -run TestFaultFigures -v
func TestFaultFigures(t *testing.T) {
	runs := 10
	if v := os.Getenv("FGPU_FAULT_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("FGPU_FAULT_RUNS=%q is not a positive number", v)
		}
		runs = n
	}
	ctx := context.Background()
	freshGPUs(t)
	t.Cleanup(func() { recoverGPU(t, 0); recoverGPU(t, 1); clearFaults(t, "all") })
	ns := cluster.Namespace(t, "figures")
	// The replicas start together on gpu-0: gpu-1 is fenced while they are placed.
	inject(t, 1, "thermal")
	waitTaints(t, "gpu-1", slowdownWait, api.DegradedTaintKey+"=thermal:NoSchedule")
	deployment(t, ns, "app", 3, 0)
	cur := waitPlaced(t, ns, "app", 3, time.Minute, "gpu-0")
	recoverGPU(t, 1)
	// A slowdown's end is damped like its start (SlowdownPolls readings): up to 6 s here.
	waitTaints(t, "gpu-1", slowdownWait)

	// A non-fatal condition on the GPU they run on: NoSchedule only, and they stay.
	inject(t, 0, "row-remap-failure")
	waitTaints(t, "gpu-0", 5*time.Second, api.DegradedTaintKey+"=row-remap-failure:NoSchedule")
	time.Sleep(10 * time.Second) // time for a wrong eviction to show
	if stayed := waitPlaced(t, ns, "app", 3, 5*time.Second, "gpu-0"); !maps.Equal(stayed, cur) {
		t.Fatalf("running pods did not stay on a GPU with a non-fatal fault: %v, before %v", stayed, cur)
	}
	recoverGPU(t, 0)
	clearFaults(t, "gpu-0")
	waitTaints(t, "gpu-0", 10*time.Second)

	var toTaint, toEvicted, toRunning []time.Duration
	for run := range runs {
		on := onOneGPU(t, ns, cur)
		idx := int(on[len("gpu-")] - '0')
		other := "gpu-0"
		if on == "gpu-0" {
			other = "gpu-1"
		}
		injected := inject(t, idx, "xid 79")
		waitTaints(t, on, 5*time.Second, api.FaultTaintKey+"=xid-79:NoExecute")
		tTaint := time.Since(injected)
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			for name := range cur {
				p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
				if err == nil && p.DeletionTimestamp == nil {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			t.Fatalf("run %d: the pods on %s were not evicted within 30 s", run, on)
		}
		tEvicted := time.Since(injected)
		cur = waitPlaced(t, ns, "app", 3, 30*time.Second, other)
		tRunning := time.Since(injected)
		t.Logf("run %d (%s → %s): fault → taint %s, → evicted %s, → replacements running %s", run, on, other, tTaint, tEvicted, tRunning)
		toTaint, toEvicted, toRunning = append(toTaint, tTaint), append(toEvicted, tEvicted), append(toRunning, tRunning)

		// Recover: the fault file goes, an admin clears the latched XID (and the back-off
		// that repeated faults start).
		recoverGPU(t, idx)
		clearFaults(t, on)
		waitTaints(t, on, 10*time.Second)
		if err := loadgen.Check(ctx, cluster.Client, framework.Driver); err != nil {
			t.Errorf("run %d: invariant: %v", run, err)
		}
	}
	// The three replicas' claims only: an evicted pod's share that stayed counted would show.
	waitHeld(t, ns, 3*10<<30)
	t.Logf("%d runs: fault → taint p50 %s max %s; → evicted p50 %s max %s; → replacements running p50 %s max %s",
		runs, p50(toTaint), slices.Max(toTaint), p50(toEvicted), slices.Max(toEvicted), p50(toRunning), slices.Max(toRunning))
	if err := cluster.Client.AppsV1().Deployments(ns).Delete(ctx, "app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitHeld(t, ns, 0)
	t.Logf("capacity leaked after %d fault/recover cycles: 0", runs)
}

// onOneGPU is the one device the running pods share.
func onOneGPU(t *testing.T, ns string, placed map[string]string) string {
	t.Helper()
	var on string
	for _, d := range placed {
		if on != "" && d != on {
			t.Fatalf("the replicas of %s are on several GPUs: %v", ns, placed)
		}
		on = d
	}
	return on
}

// freshGPUs starts a test from GPUs with no fault: whatever an earlier test left (a latched
// fault, a flapping back-off) is recovered and cleared.
func freshGPUs(t *testing.T) {
	t.Helper()
	recoverGPU(t, 0)
	recoverGPU(t, 1)
	clearFaults(t, "all")
	waitTaints(t, "gpu-0", 30*time.Second)
	waitTaints(t, "gpu-1", 30*time.Second)
}

func clearFaults(t *testing.T, device string) {
	t.Helper()
	if out, err := framework.Run(context.Background(), fgpuBin, "faults", "clear", device); err != nil {
		t.Fatalf("fgpu faults clear %s: %v: %s", device, err, out)
	}
}

// waitHeld waits until the namespace's allocated claims hold want bytes of GPU memory.
func waitHeld(t *testing.T, ns string, want int64) {
	t.Helper()
	var held int64
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := cluster.Client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		held = 0
		for _, c := range list.Items {
			if c.Status.Allocation == nil {
				continue
			}
			for _, r := range c.Status.Allocation.Devices.Results {
				if q, ok := r.ConsumedCapacity[api.CapacityMemory]; ok {
					held += q.Value()
				}
			}
		}
		return held == want, nil
	})
	if err != nil {
		t.Fatalf("namespace %s's claims hold %d bytes of GPU memory, want %d", ns, held, want)
	}
}

func p50(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
