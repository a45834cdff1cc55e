package controller

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/placement"
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
	free := func(node string) (int64, int64) {
		m := e.c.model
		m.mu.Lock()
		defer m.mu.Unlock()
		if err := m.ensureCore(e.c.decider.schedPolicy, e.c.decider); err != nil {
			t.Fatal(err)
		}
		return m.core.FreeCPU(m.coreIdx[node])
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

// The standard class's policy measures against the claims it has seen once enough were
// seen: before, against the default workload.
func TestLearnsWorkloadFromClaims(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"))
	m := e.c.model
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.ensureCore(e.c.decider.schedPolicy, e.c.decider); err != nil {
		t.Fatal(err)
	}
	first := m.scheduler(api.LatencyStandard).Policy()
	r := &placement.Request{CPUMilli: 3000, GPUs: 1, Share: 300}
	minSeen := placement.DefaultLearnOptions().MinSeen
	for i := range minSeen - 1 {
		m.observe(types.UID(fmt.Sprint(i)), r, e.c.decider.schedPolicy)
		m.observe(types.UID(fmt.Sprint(i)), r, e.c.decider.schedPolicy) // decided again: counted once
	}
	if m.scheduler(api.LatencyStandard).Policy() != first || m.learn.Seen() != minSeen-1 {
		t.Fatalf("policy replaced, or %d claims counted, before %d distinct claims were seen", m.learn.Seen(), minSeen)
	}
	m.observe("last", r, e.c.decider.schedPolicy)
	if m.scheduler(api.LatencyStandard).Policy() == first {
		t.Fatal("the standard policy still measures against the default workload")
	}
	if w := m.learn.Workload(); len(w) != 1 || w[0].CPUMilli != 3000 || w[0].Share != 300 {
		t.Errorf("learned %+v", w)
	}
	// A rebuilt core keeps the learned workload.
	m.dirty = true
	var got placement.Workload
	if err := m.ensureCore(func(l api.LatencyClass, w placement.Workload) placement.Policy {
		got = w
		return e.c.decider.schedPolicy(l, w)
	}, e.c.decider); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Share != 300 {
		t.Errorf("rebuilt core's policies measure against %+v, not the learned workload", got)
	}
}
