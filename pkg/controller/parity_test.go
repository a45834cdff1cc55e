package controller

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// The placement core holds each node's allocatable CPU and memory less what bound and
// assumed pods request there, as the simulator's does: fragmentation-aware placement
// counts the CPU a node has left for the GPUs it has left.
func TestCoreCountsNodeCPUAndMemory(t *testing.T) {
	busy := builders.MakePod("x", "busy").CPU("4").Bound("n1").Obj()
	busy.Spec.Containers[0].Resources.Requests["memory"] = resource.MustParse("8Gi")
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeNode("n2").CPU("8").Obj(),
		builders.MakeSlice("n1", 1, "80Gi"), builders.MakeSlice("n2", 1, "80Gi"), busy,
		builders.MakeClaim("a", "c").Memory("10Gi").Obj(), builders.MakePod("a", "p").Claim("c").CPU("2").NodeSelector("kubernetes.io/hostname", "n1").Obj())
	e.run()
	if got := e.placedOn("a", "c"); got != "n1/gpu-0" {
		t.Fatalf("placed on %q", got)
	}
	free := func(node string) (cpu, mem int64) {
		e.c.model.Update(func(tx *model.Tx) {
			if err := tx.EnsureCore(e.c.decider.schedPolicy, e.c.decider); err != nil {
				t.Fatal(err)
			}
			for ni, gs := range tx.CoreGPUs() {
				if gs[0].Node() == node {
					cpu, mem = tx.Scheduler(api.LatencyStandard).Cluster().FreeCPU(ni)
				}
			}
		})
		return cpu, mem
	}
	// n1: 16 CPUs and 64Gi, less the bound pod's 4 and 8Gi and the assumed pod's 2.
	if cpu, mem := free("n1"); cpu != 10000 || mem != 56<<10 {
		t.Errorf("core's n1 has %dm CPU and %d MiB free, want 10000m and %d", cpu, mem, 56<<10)
	}
	if cpu, mem := free("n2"); cpu != 8000 || mem != 64<<10 {
		t.Errorf("core's n2 has %dm CPU and %d MiB free, want 8000m and %d", cpu, mem, 64<<10)
	}
	// The pod bound and then gone: its CPU is free again; a node's allocatable follows the Node.
	if err := e.client.CoreV1().Pods("a").Delete(e.ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.client.CoreV1().Nodes().Update(e.ctx, builders.MakeNode("n2").CPU("12").Obj(), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.settle()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		cpu1, _ := free("n1")
		cpu2, _ := free("n2")
		if cpu1 == 12000 && cpu2 == 12000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("core's free CPU n1 %dm, n2 %dm; want 12000m each", cpu1, cpu2)
		}
	}
}
