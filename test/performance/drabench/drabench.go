// Package drabench times one placement decision made by fgpu's placement
// core and by the upstream DRA structured allocator
// (k8s.io/dynamic-resource-allocation/structured) on the same cluster state:
// N nodes x 8 GPUs, filled to a given fraction by fractional claims, and one
// new claim for a share of one GPU.
//
// Upstream, a GPU is a device with allowMultipleAllocations and a consumable
// "memory" capacity; the claim requests an amount of it. kube-scheduler builds
// an allocator per pod and calls Allocate for every node, so one upstream
// decision is NewAllocator plus Allocate on each node (DRA adds no node
// score; the first feasible node would do).
package drabench

import (
	"context"
	"fmt"
	"math/rand"
	"sort"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

const (
	gpusPerNode = 8
	driver      = "gpu.fgpu.dev"
	className   = "fgpu"
	capName     = resourceapi.QualifiedName("memory")
)

// Result is one cluster size and fill.
type Result struct {
	Nodes      int     `json:"nodes"`
	Fill       float64 `json:"fill"`
	FgpuUs     float64 `json:"fgpu_us"`     // median per decision
	UpstreamUs float64 `json:"upstream_us"` // median per decision
	Ratio      float64 `json:"ratio"`       // upstream / fgpu
	Feasible   int     `json:"upstream_feasible_nodes"`
	FgpuFits   int     `json:"fgpu_feasible_nodes"`
	FgpuNode   string  `json:"fgpu_node"`
}

// Run builds the cluster, fills it and times both allocators. share is the
// new claim's share of one GPU in milli; iters bounds the repetitions (fewer
// are run for the upstream side when one decision is slow).
func Run(nodes int, fill float64, share int64, iters int, seed int64) (*Result, error) {
	specs := make([]placement.NodeSpec, nodes)
	for i := range specs {
		specs[i] = placement.NodeSpec{Name: fmt.Sprintf("node-%05d", i), CPUMilli: 1 << 40, MemoryMiB: 1 << 40}
		for g := 0; g < gpusPerNode; g++ {
			specs[i].GPUs = append(specs[i].GPUs, placement.GPUSpec{Model: "H100", Capacity: 1000})
		}
	}
	c, err := placement.NewCluster(specs)
	if err != nil {
		return nil, err
	}
	fillCluster(c, fill, seed)

	// fgpu: the default policy over the same state.
	pol, err := placement.New("fgpu", benchShapes())
	if err != nil {
		return nil, err
	}
	s := placement.NewScheduler(c, pol, seed)
	req := &placement.Request{Name: "new", GPUs: 1, Share: share}
	res := &Result{Nodes: nodes, Fill: fill}
	fg := make([]time.Duration, 0, iters)
	for i := 0; i < iters; i++ {
		t0 := time.Now()
		p, err := s.Place(req)
		fg = append(fg, time.Since(t0))
		if err != nil {
			return nil, fmt.Errorf("fgpu: %w", err)
		}
		res.FgpuNode = p.NodeName
	}
	res.FgpuUs = median(fg)
	for n := 0; n < c.Len(); n++ {
		free, _ := c.GPUs(n)
		for _, f := range free {
			if f >= share {
				res.FgpuFits++
				break
			}
		}
	}

	// Upstream: the same state as ResourceSlices plus allocated capacity.
	up, err := newUpstream(c, share)
	if err != nil {
		return nil, err
	}
	var ud []time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; i < iters && (i < 3 || time.Now().Before(deadline)); i++ {
		t0 := time.Now()
		n, err := up.decide()
		ud = append(ud, time.Since(t0))
		if err != nil {
			return nil, fmt.Errorf("upstream: %w", err)
		}
		res.Feasible = n
	}
	res.UpstreamUs = median(ud)
	res.Ratio = res.UpstreamUs / res.FgpuUs
	return res, nil
}

// fillCluster assigns random fractional claims straight to random GPUs
// until the GPU fill is reached (O(claims), so 10,000-node clusters fill
// fast; the decision timed afterwards is the same either way).
func fillCluster(c *placement.Cluster, fill float64, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	target := int64(float64(c.GPUCapacity()) * (1 - fill))
	for misses := 0; c.GPUFree() > target && misses < 1000; {
		n := rng.Intn(c.Len())
		free, _ := c.GPUs(n)
		g := rng.Intn(len(free))
		share := int64(100 * (1 + rng.Intn(10)))
		if share > free[g] {
			misses++
			continue
		}
		misses = 0
		r := &placement.Request{GPUs: 1, Share: share}
		_ = c.Assign(placement.Placement{Node: n, GPUs: []int{g}, Share: []int64{share}}, r)
	}
}

func benchShapes() placement.Workload {
	var w placement.Workload
	for s := int64(100); s <= 1000; s += 100 {
		w = append(w, placement.Shape{GPUs: 1, Share: s, Weight: 0.1})
	}
	return w
}

type upstream struct {
	nodes   []*v1.Node
	slices  []*resourceapi.ResourceSlice
	state   structured.AllocatedState
	classes classLister
	claim   *resourceapi.ResourceClaim
	cache   *cel.Cache
}

func newUpstream(c *placement.Cluster, share int64) (*upstream, error) {
	u := &upstream{
		state: structured.AllocatedState{
			AggregatedCapacity: structured.NewConsumedCapacityCollection(),
		},
		classes: classLister{&resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: className}}},
		cache:   cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}),
	}
	for n := 0; n < c.Len(); n++ {
		name := c.NodeName(n)
		u.nodes = append(u.nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		sl := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   driver,
				Pool:     resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
				NodeName: ptr.To(name),
			},
		}
		free, capa := c.GPUs(n)
		for g := range free {
			dev := fmt.Sprintf("gpu-%d", g)
			sl.Spec.Devices = append(sl.Spec.Devices, resourceapi.Device{
				Name:                     dev,
				AllowMultipleAllocations: ptr.To(true),
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					capName: {Value: *resource.NewQuantity(capa[g], resource.DecimalSI)},
				},
			})
			if used := capa[g] - free[g]; used > 0 {
				id := structured.MakeDeviceID(driver, name, dev)
				u.state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id,
					map[resourceapi.QualifiedName]resource.Quantity{capName: *resource.NewQuantity(used, resource.DecimalSI)}))
			}
		}
		u.slices = append(u.slices, sl)
	}
	u.claim = &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "default", UID: "new-uid"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: className,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					capName: *resource.NewQuantity(share, resource.DecimalSI),
				}},
			},
		}}}},
	}
	return u, nil
}

// decide runs one scheduling decision upstream-style and returns the number
// of nodes the claim fits on.
func (u *upstream) decide() (int, error) {
	ctx := context.Background()
	a, err := structured.NewAllocator(ctx, structured.Features{ConsumableCapacity: true},
		u.state, u.classes, u.slices, u.cache)
	if err != nil {
		return 0, err
	}
	feasible := 0
	for _, n := range u.nodes {
		res, err := a.Allocate(ctx, n, []*resourceapi.ResourceClaim{u.claim})
		if err != nil {
			return 0, err
		}
		if len(res) > 0 {
			feasible++
		}
	}
	return feasible, nil
}

type classLister []*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %q not found", name)
}

func median(d []time.Duration) float64 {
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[len(s)/2].Nanoseconds()) / 1000
}
