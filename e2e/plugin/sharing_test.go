package plugin

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

// Three pods of 10, 20 and 30Gi run at once on the one 80Gi GPU, with distinct share IDs;
// each container holds its own cap and the GPU's MPS pipe directory, mounted.
func TestThreePodsShareOneGPU(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "share")
	sizes := map[string]string{"small": "10Gi", "medium": "20Gi", "large": "30Gi"}
	for name, mem := range sizes {
		if _, err := cluster.Create(ctx, framework.MakeGPUPod(ns, name).Memory(mem)); err != nil {
			t.Fatal(err)
		}
	}
	shareIDs := map[string]bool{}
	pipes := map[string]bool{}
	for name, mem := range sizes {
		pod, err := cluster.WaitRunning(ctx, ns, name, 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cluster.Probe(ctx, ns, name)
		if err != nil {
			t.Fatal(err)
		}
		wantLimit := map[string]string{"10Gi": "0=10240M", "20Gi": "0=20480M", "30Gi": "0=30720M"}[mem]
		if got := r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; got != wantLimit {
			t.Errorf("%s: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want %q", name, got, wantLimit)
		}
		if r.Env["FGPU_MEMORY_LIMIT"] != mem || r.Env["FGPU_SHARING_MODE"] != "mps" {
			t.Errorf("%s: env %v", name, r.Env)
		}
		// Fake GPUs' PCI bus ids are in no dmem.capacity (and the local cluster runs cgroup v1):
		// MPS caps each client process only, and the container is told so.
		if r.Env["FGPU_MEMORY_CAP"] != "mps-per-process" || !strings.HasPrefix(r.Env["FGPU_MEMORY_ENFORCEMENT"], "mps: caps each MPS client process") {
			t.Errorf("%s: FGPU_MEMORY_CAP=%q FGPU_MEMORY_ENFORCEMENT=%q, want mps-per-process", name, r.Env["FGPU_MEMORY_CAP"], r.Env["FGPU_MEMORY_ENFORCEMENT"])
		}
		if r.Env["FGPU_MEMORY_LIMIT_0"] != mem || r.Env["FGPU_SHARE_ID_0"] != r.Env["FGPU_SHARE_ID"] {
			t.Errorf("%s: a one-device claim's FGPU_*_0 must repeat its FGPU_*: %v", name, r.Env)
		}
		pipe := r.Env["CUDA_MPS_PIPE_DIRECTORY"]
		if pipe == "" || !slices.Contains(r.Mounts, pipe) || !r.PipeDirWritable {
			t.Errorf("%s: pipe directory %q not mounted writable (mounts %v)", name, pipe, r.Mounts)
		}
		_, visible := r.Env["CUDA_VISIBLE_DEVICES"]
		if !slices.Contains(r.Mounts, "/dev/shm") || !slices.Contains(r.Devices, "/dev/nvidia0") || visible {
			t.Errorf("%s: want /dev/shm mounted, /dev/nvidia0 and no CUDA_VISIBLE_DEVICES: %+v", name, r)
		}
		pipes[pipe] = true
		shareIDs[r.Env["FGPU_SHARE_ID"]] = true

		claim, err := cluster.ClaimOf(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		res := claim.Status.Allocation.Devices.Results[0]
		if res.Device != "gpu-0" || res.ShareID == nil || string(*res.ShareID) != r.Env["FGPU_SHARE_ID"] {
			t.Errorf("%s: allocation %+v does not match what the container got (%s)", name, res, r.Env["FGPU_SHARE_ID"])
		}
		if err := waitDeviceStatus(ctx, claim.Namespace, claim.Name, `"mode":"mps"`); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if len(shareIDs) != 3 || shareIDs[""] {
		t.Errorf("share IDs not distinct: %v", shareIDs)
	}
	if len(pipes) != 1 {
		t.Errorf("one GPU, one domain: want one MPS pipe directory, got %v", pipes)
	}
	st, err := framework.ReadNodeState()
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Daemons) != 1 {
		t.Errorf("want one MPS daemon, have %v", st.Daemons)
	}
}

// A claim that fits no GPU stays Pending with the scheduler's reason; nothing is prepared.
func TestClaimThatFitsNoGPUStaysPending(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "nofit")
	pod, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "huge").Memory("100Gi"))
	if err != nil {
		t.Fatal(err)
	}
	msg, err := cluster.WaitEvent(ctx, ns, "huge", "cannot allocate all claims", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("event: %s", msg)
	pod, _ = cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if pod.Status.Phase != corev1.PodPending || pod.Spec.NodeName != "" {
		t.Fatalf("pod %s on %q, want Pending unscheduled", pod.Status.Phase, pod.Spec.NodeName)
	}
	claim, err := cluster.ClaimOf(ctx, pod)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := framework.ReadNodeState()
	if slices.Contains(st.SpecClaims, string(claim.UID)) || st.Checkpoint.Claims[string(claim.UID)] != nil {
		t.Fatalf("something was prepared for an unallocatable claim: %+v", st)
	}
}

// Deleting the pods unprepares: specs gone, the MPS stand-in stopped after the last one.
func TestDeletingPodsUnprepares(t *testing.T) {
	ctx := context.Background()
	ns := cluster.Namespace(t, "unprep")
	var uids []string
	for _, name := range []string{"one", "two"} {
		pod, err := cluster.Create(ctx, framework.MakeGPUPod(ns, name).Memory("10Gi"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cluster.WaitRunning(ctx, ns, name, 2*time.Minute); err != nil {
			t.Fatal(err)
		}
		claim, _ := cluster.ClaimOf(ctx, pod)
		uids = append(uids, string(claim.UID))
	}
	st, _ := framework.ReadNodeState()
	if len(st.Daemons) != 1 || len(st.MPSDirs) != 1 {
		t.Fatalf("want one daemon and one MPS directory, have %v %v", st.Daemons, st.MPSDirs)
	}
	deletePod(t, ns, "one")
	st = waitNodeState(t, func(s framework.NodeState) bool { return !slices.Contains(s.SpecClaims, uids[0]) })
	if !slices.Contains(st.SpecClaims, uids[1]) || len(st.Daemons) != 1 {
		t.Fatalf("the remaining pod lost its spec or daemon: %+v", st)
	}
	deletePod(t, ns, "two")
	waitNodeState(t, func(s framework.NodeState) bool {
		return len(s.SpecClaims) == 0 && len(s.Daemons) == 0 && len(s.MPSDirs) == 0 && len(s.Checkpoint.Claims) == 0
	})
}

func deletePod(t *testing.T, ns, name string) {
	t.Helper()
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(ns).Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// waitNodeState waits until the node's state satisfies ok, failing with the last state seen.
func waitNodeState(t *testing.T, ok func(framework.NodeState) bool) framework.NodeState {
	t.Helper()
	var st framework.NodeState
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		var err error
		st, err = framework.ReadNodeState()
		return err == nil && ok(st), nil
	})
	if err != nil {
		t.Fatalf("node state never settled: specs %v, daemons %v, MPS dirs %v, checkpoint %d claims",
			st.SpecClaims, st.Daemons, st.MPSDirs, len(st.Checkpoint.Claims))
	}
	return st
}

func waitDeviceStatus(ctx context.Context, ns, name, substr string) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		c, err := cluster.Client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, d := range c.Status.Devices {
			if d.Data != nil && strings.Contains(string(d.Data.Raw), substr) {
				return true, nil
			}
		}
		return false, nil
	})
}

// Each GPU says which mode caps an MPS share's memory in the device attribute memoryCap (the
// values of FGPU_MEMORY_CAP): fake GPUs are in no dmem.capacity, so mps-per-process.
func TestSliceSaysWhatCapsMemory(t *testing.T) {
	ctx := context.Background()
	list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + framework.Driver})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			n++
			if a, ok := d.Attributes["memoryCap"]; !ok || a.StringValue == nil || *a.StringValue != "mps-per-process" {
				t.Errorf("%s: memoryCap attribute %+v, want mps-per-process", d.Name, a)
			}
			if _, ok := d.Attributes["memoryEnforcement"]; ok {
				t.Errorf("%s: still has the old memoryEnforcement attribute", d.Name)
			}
		}
	}
	if n == 0 {
		t.Fatal("no fgpu devices published")
	}
}
