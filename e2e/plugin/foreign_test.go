package plugin

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

// A GPU with a process fgpu did not start is not offered and keeps an admin's compute mode;
// once the process exits the GPU comes back, and the mode fgpu sets for its tenant is the
// admin's again when the tenant goes. The MPS server it stops leaves no zombie behind.
func TestForeignProcessKeepsTheGPU(t *testing.T) {
	ctx := context.Background()
	devDir := filepath.Join(framework.StateDir, "fake-dev")
	modeFile, procFile := filepath.Join(devDir, "nvidia0.compute-mode"), fake.ProcessFile(devDir, 0)
	// A host job on the GPU, as NVML would list it, and an admin's compute mode.
	job := exec.Command("sleep", "600")
	if err := job.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = job.Process.Kill()
		_ = job.Wait()
		os.Remove(procFile)
		os.Remove(modeFile)
	})
	if err := os.WriteFile(modeFile, []byte("Prohibited\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(procFile, []byte(strconv.Itoa(job.Process.Pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes, err := cluster.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != 1 {
		t.Fatalf("want one node: %v", err)
	}
	node := nodes.Items[0].Name
	waitTaint(t, true)
	if ev, err := cluster.WaitEvent(ctx, metav1.NamespaceDefault, node, "runs 1 process(es) fgpu did not start;", 30*time.Second); err != nil {
		t.Fatal(err)
	} else {
		t.Log(ev)
	}

	ns := cluster.Namespace(t, "foreign")
	pod, err := cluster.Create(ctx, framework.MakeGPUPod(ns, "waits").Memory("10Gi"))
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(15 * time.Second)
	if p, err := cluster.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("a pod was placed on a GPU with a foreign process: %v %v", p.Spec.NodeName, err)
	}
	if m := readMode(t, modeFile); m != "Prohibited" {
		t.Fatalf("fgpu changed the compute mode of a GPU with a foreign process to %s", m)
	}

	// The job exits: NVML no longer lists it.
	if err := os.Remove(procFile); err != nil {
		t.Fatal(err)
	}
	waitTaint(t, false)
	if _, err := cluster.WaitEvent(ctx, metav1.NamespaceDefault, node, "runs no process fgpu did not start any more", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, ns, "waits", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if m := readMode(t, modeFile); m != "ExclusiveProcess" {
		t.Fatalf("one MPS tenant on the GPU: mode %s, want ExclusiveProcess", m)
	}
	// The stand-in MPS server is listed on the GPU, as NVML lists a real one: fgpu's own.
	if raw, _ := os.ReadFile(fake.ServerFile(devDir, 0)); strings.TrimSpace(string(raw)) == "" {
		t.Fatal("the stand-in MPS server is not listed among the GPU's processes")
	}
	deletePod(t, ns, "waits")
	waitNodeState(t, func(s framework.NodeState) bool { return len(s.Daemons) == 0 && len(s.Checkpoint.Claims) == 0 })
	// Its server, stopping with the last tenant, is not taken for a foreign process.
	time.Sleep(2 * plugin.DefaultForeignPoll)
	waitTaint(t, false)
	if m := readMode(t, modeFile); m != "Prohibited" {
		t.Fatalf("after the last tenant went the mode is %s, want the admin's Prohibited back", m)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return len(pluginZombies()) == 0, nil
	})
	if err != nil {
		t.Fatalf("zombies left in the plugin's container: %v", pluginZombies())
	}
}

func readMode(t *testing.T, path string) string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(raw))
}

// waitTaint waits until gpu-0 carries the foreign-process taint (or no longer does).
func waitTaint(t *testing.T, want bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		slices, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + framework.Driver})
		if err != nil {
			return false, nil
		}
		for _, s := range slices.Items {
			for _, d := range s.Spec.Devices {
				if d.Name != "gpu-0" {
					continue
				}
				has := false
				for _, tt := range d.Taints {
					has = has || (tt.Key == api.ForeignTaintKey && tt.Effect == resourceapi.DeviceTaintEffectNoSchedule)
				}
				return has == want, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("gpu-0's taint %s never became %v", api.ForeignTaintKey, want)
	}
}

// pluginZombies are the zombie children of the plugin's processes.
func pluginZombies() []int {
	parents := map[int]bool{}
	for _, pid := range framework.PluginPIDs() {
		parents[pid] = true
	}
	var zombies []int
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		raw, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(raw, ')')
		f := bytes.Fields(raw[i+1:])
		if len(f) < 2 || string(f[0]) != "Z" {
			continue
		}
		if ppid, _ := strconv.Atoi(string(f[1])); parents[ppid] {
			pid, _ := strconv.Atoi(p.Name())
			zombies = append(zombies, pid)
		}
	}
	return zombies
}
