package podledger

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

func ledgerPod(uid, cpu string) *corev1.Pod {
	p := builders.MakePod("a", uid).CPU(cpu).Obj()
	p.UID = types.UID(uid)
	return p
}

func TestPodLedgerAssumeBindDelete(t *testing.T) {
	l := New()
	t0 := builders.Created.Time
	p, q := ledgerPod("p", "2"), ledgerPod("q", "3")
	l.Assume([]*corev1.Pod{p, q}, "n1", t0)
	if got := l.Requested("n1", nil).MilliCPU; got != 5000 {
		t.Errorf("assumed on n1: %dm CPU, want 5000m", got)
	}
	if got := l.Requested("n1", []*corev1.Pod{p}).MilliCPU; got != 3000 {
		t.Errorf("n1 except the pod being placed: %dm, want 3000m", got)
	}
	bound := p.DeepCopy()
	bound.Spec.NodeName = "n1"
	l.Bound(bound, false)
	if got := l.Requested("n1", nil).MilliCPU; got != 5000 {
		t.Errorf("after p bound: %dm on n1, want 5000m (bound instead of assumed, not both)", got)
	}
	l.Bound(bound, true)
	if got := l.Requested("n1", nil).MilliCPU; got != 3000 {
		t.Errorf("after p deleted: %dm on n1, want 3000m", got)
	}
	l.Drop([]*corev1.Pod{q})
	if got := l.Requested("n1", nil); got != (podfit.Requests{}) {
		t.Errorf("after dropping q: %+v on n1, want nothing", got)
	}
	if len(l.assumedOn)+len(l.boundOn) != 0 {
		t.Errorf("empty per-node sums kept: %v %v", l.assumedOn, l.boundOn)
	}
}

func TestPodLedgerAvoidAndExpire(t *testing.T) {
	l := New()
	t0 := builders.Created.Time
	p := ledgerPod("p", "1")
	l.Assume([]*corev1.Pod{p}, "n1", t0)
	l.Avoid([]*corev1.Pod{p}, "n1")
	if !l.Avoided([]*corev1.Pod{p})["n1"] {
		t.Error("the node where the allocation timed out is not avoided")
	}
	if got := l.Requested("n1", nil); got != (podfit.Requests{}) {
		t.Errorf("a timed-out pod still counts on its node: %+v", got)
	}
	l.Assume([]*corev1.Pod{p}, "n2", t0)
	l.Expire(t0)
	if l.Requested("n2", nil).MilliCPU != 1000 {
		t.Error("Expire dropped a pod assumed at the cut-off")
	}
	l.Expire(t0.Add(time.Second))
	if got := l.Requested("n2", nil); got != (podfit.Requests{}) {
		t.Errorf("an expired pod still counts: %+v", got)
	}
	l.Bound(p, true)
	if len(l.Avoided([]*corev1.Pod{p})) != 0 {
		t.Error("a deleted pod's avoided nodes are kept")
	}
}
