package replay

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

// smallTrace is an openb-like trace small enough for make test: nodes of 2, 4 and 8 GPUs
// of two models with CPU that runs short, and pods of shares, whole GPUs and a few
// multi-GPU ones.
func smallTrace() ([]placement.NodeSpec, []placement.Request) {
	rng := rand.New(rand.NewSource(7))
	var nodes []placement.NodeSpec
	for i := range 48 {
		n := placement.NodeSpec{Name: fmt.Sprintf("node-%03d", i), CPUMilli: 32000 + int64(i%3)*32000, MemoryMiB: 262144}
		model, gpus := "T4", 2
		switch i % 3 {
		case 1:
			model, gpus = "G2", 8
		case 2:
			gpus = 4
		}
		for range gpus {
			n.GPUs = append(n.GPUs, placement.GPUSpec{Model: model, Capacity: placement.DefaultGPUCapacity})
		}
		nodes = append(nodes, n)
	}
	shares := []int64{100, 250, 300, 460, 500, 700}
	var pods []placement.Request
	for i := range 300 {
		p := placement.Request{Name: fmt.Sprintf("pod-%d", i), CPUMilli: int64(1+rng.Intn(12)) * 1000, MemoryMiB: int64(1+rng.Intn(32)) * 1024, GPUs: 1}
		switch k := rng.Intn(20); {
		case k < 9:
			p.Share = shares[rng.Intn(len(shares))]
		case k == 19:
			p.GPUs = 2 + rng.Intn(3)
		}
		pods = append(pods, p)
	}
	return nodes, pods
}

// The allocator, driven through its informers, decide and write over a fake API server,
// places a trace as fgpu sim --learn does: the same allocation ratio on every seed.
func TestReplayMatchesSim(t *testing.T) {
	nodes, pods := smallTrace()
	for _, seed := range []int64{1, 2} {
		cfg := Config{Nodes: nodes, Pods: GPUPods(pods), Seed: seed, Tune: 1.3}
		want, err := Sim(cfg)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if got.Invariant != nil {
			t.Fatal(got.Invariant)
		}
		t.Logf("seed %d: sim %.2f%% (%d placed), replay %.2f%% (%d of %d placed); CPU per placed claim %s (%s in the fake API server); writes:\n%s",
			seed, 100*want.Final.Alloc, want.Placed, 100*got.Alloc, got.Placed, got.Arrived,
			got.CPU/time.Duration(got.Placed), got.InAPI/time.Duration(got.Placed), got.WritesTable())
		if math.Abs(got.Alloc-want.Final.Alloc) > 1e-9 || got.Placed != want.Placed {
			t.Errorf("seed %d: replay allocated %.4f (%d pods), fgpu sim %.4f (%d pods)", seed, got.Alloc, got.Placed, want.Final.Alloc, want.Placed)
		}
	}
}

// A claim that waits is looked at again after every placement, as a burst does through
// the controller's kicks: the allocator still places as fgpu sim does, and writes per
// placed claim are reported.
func TestReplayRequeueWrites(t *testing.T) {
	nodes, pods := smallTrace()
	cfg := Config{Nodes: nodes, Pods: GPUPods(pods), Seed: 1, Tune: 1.3, Requeue: true}
	want, err := Sim(cfg)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got.Invariant != nil {
		t.Fatal(got.Invariant)
	}
	t.Logf("placed %d of %d; writes:\n%s", got.Placed, got.Arrived, got.WritesTable())
	if got.Placed != want.Placed {
		t.Errorf("replay placed %d pods, fgpu sim %d", got.Placed, want.Placed)
	}
	// A placed claim costs three writes: its finalizers and status annotation, its
	// allocation, and an event on its pod. A claim that waits costs two, once (its message
	// does not change as it is looked at again): its annotation, and an event on its pod.
	waiting := got.Arrived - got.Placed
	wantWrites := map[string]int{"update resourceclaims": got.Placed, "update resourceclaims/status": got.Placed,
		"create events": got.Placed + waiting, "patch resourceclaims": waiting}
	if !maps.Equal(got.Writes, wantWrites) {
		t.Errorf("writes %v, want %v", got.Writes, wantWrites)
	}
}
