package model

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// nodes are nodes without limits or pods.
type nodes struct{}

func (nodes) Allocatable(string) (int64, int64) { return 1 << 20, 1 << 20 }
func (nodes) Requested(string) podfit.Requests  { return podfit.Requests{} }
func (nodes) ChangedNodes() []string            { return nil }

func policies(_ api.LatencyClass, w placement.Workload) placement.Policy {
	return placement.NewFGPU(w, placement.DefaultOptions())
}

// The standard class's policy measures against the claims it has seen once enough were
// seen: before, against the default workload.
func TestLearnsWorkloadFromClaims(t *testing.T) {
	m := New(api.DriverName)
	m.SetNodeDevices("n1", map[string]resourceapi.Device{"gpu-0": {Name: "gpu-0"}})
	if err := m.ensureCore(policies, nodes{}); err != nil {
		t.Fatal(err)
	}
	first := m.core.scheduler(api.LatencyStandard).Policy()
	r := &placement.Request{CPUMilli: 3000, GPUs: 1, Share: 300}
	minSeen := placement.DefaultLearnOptions().MinSeen
	for i := range minSeen - 1 {
		m.core.observe(types.UID(fmt.Sprint(i)), r, policies)
		m.core.observe(types.UID(fmt.Sprint(i)), r, policies) // decided again: counted once
	}
	if m.core.scheduler(api.LatencyStandard).Policy() != first || m.core.learn.Seen() != minSeen-1 {
		t.Fatalf("policy replaced, or %d claims counted, before %d distinct claims were seen", m.core.learn.Seen(), minSeen)
	}
	m.core.observe("last", r, policies)
	if m.core.scheduler(api.LatencyStandard).Policy() == first {
		t.Fatal("the standard policy still measures against the default workload")
	}
	if w := m.core.learn.Workload(); len(w) != 1 || w[0].CPUMilli != 3000 || w[0].Share != 300 {
		t.Errorf("learned %+v", w)
	}
	// A rebuilt core keeps the learned workload.
	m.core.dirty = true
	var got placement.Workload
	if err := m.ensureCore(func(l api.LatencyClass, w placement.Workload) placement.Policy {
		got = w
		return policies(l, w)
	}, nodes{}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Share != 300 {
		t.Errorf("rebuilt core's policies measure against %+v, not the learned workload", got)
	}
}
