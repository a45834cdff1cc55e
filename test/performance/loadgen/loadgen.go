// Package loadgen measures the allocator: it publishes fake GPU nodes (Node objects and
// fenced ResourceSlices, no kubelet), then creates a burst of claims with a pod each and
// times each claim from creation to allocation. It runs against any cluster (the local
// one, through test/performance/cmd/allocator-bench) or a fake API server (the Go
// benchmarks).
package loadgen

import (
	"context"
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/pkg/controller/invariant"
)

// Options size the load.
type Options struct {
	Nodes       int
	GPUsPerNode int
	GPUMemory   string   // allocatable per GPU, e.g. 80Gi
	Claims      int      // claims in the burst
	Sizes       []string // claim memory sizes, used in turn
	Namespace   string
	Prefix      string // of node, claim and pod names
	Concurrency int    // parallel creators
	Pods        bool   // create a pod per claim (the allocator waits for one)
	Timeout     time.Duration
	Driver      string
	Class       string
}

// Defaults are the figures: 2,000 claims over 500 nodes × 8 GPUs.
func Defaults() Options {
	return Options{Nodes: 500, GPUsPerNode: 8, GPUMemory: "80Gi", Claims: 2000, Sizes: []string{"10Gi", "20Gi", "5Gi", "40Gi"},
		Namespace: "fgpu-bench", Prefix: "bench", Concurrency: 16, Pods: true, Timeout: 10 * time.Minute, Driver: "gpu.fgpu.dev", Class: "gpu.fgpu.dev"}
}

// Report is the outcome of a burst.
type Report struct {
	Claims, Allocated int
	Elapsed           time.Duration // first create to last allocation
	// Created is first create to last create (claims and pods): when it is close to
	// Elapsed, the load generator and API server, not the allocator, set the pace.
	Created       time.Duration
	PerSecond     float64
	P50, P99, Max time.Duration
	InvariantErr  error
}

func (r Report) String() string {
	inv := "ok"
	if r.InvariantErr != nil {
		inv = r.InvariantErr.Error()
	}
	created := ""
	if r.Created > 0 {
		created = fmt.Sprintf(" (all created in %s: %.1f claims/s)", r.Created.Round(time.Millisecond), float64(r.Claims)/r.Created.Seconds())
	}
	return fmt.Sprintf("claims %d, allocated %d in %s: %.1f claims/s%s; created→allocated p50 %s, p99 %s, max %s; invariant: %s",
		r.Claims, r.Allocated, r.Elapsed.Round(time.Millisecond), r.PerSecond, created, r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond), r.Max.Round(time.Millisecond), inv)
}

// NodeName is the name of bench node i.
func (o Options) NodeName(i int) string { return fmt.Sprintf("%s-node-%04d", o.Prefix, i) }

// Setup creates the namespace, the nodes and their slices (existing ones are kept).
func Setup(ctx context.Context, c kubernetes.Interface, o Options) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: o.Namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: o.Class}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", o.Driver)}}}}}
	if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	mem := resource.MustParse(o.GPUMemory)
	for i := 0; i < o.Nodes; i++ {
		name := o.NodeName(i)
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"fgpu.dev/bench": "true", "kubernetes.io/hostname": name}},
			Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: "fgpu.dev/bench", Value: "true", Effect: corev1.TaintEffectNoExecute}}},
			Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("1000")},
				Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("128"), corev1.ResourceMemory: resource.MustParse("1Ti"), corev1.ResourcePods: resource.MustParse("1000")}}}
		if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-gpus"},
			Spec: resourceapi.ResourceSliceSpec{Driver: o.Driver, NodeName: ptr.To(name), Pool: resourceapi.ResourcePool{Name: name, ResourceSliceCount: 1}}}
		for g := 0; g < o.GPUsPerNode; g++ {
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", g), AllowMultipleAllocations: ptr.To(true),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"index": {IntValue: ptr.To(int64(g))}, "productName": {StringValue: ptr.To("Bench-80GB")}},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					"memory":  {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &mem, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: resource.NewQuantity(256<<20, resource.BinarySI), Max: &mem, Step: resource.NewQuantity(256<<20, resource.BinarySI)}}},
					"compute": {Value: resource.MustParse("100"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: ptr.To(resource.MustParse("0")), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: ptr.To(resource.MustParse("0")), Max: ptr.To(resource.MustParse("100")), Step: ptr.To(resource.MustParse("1"))}}},
				},
				Taints: []resourceapi.DeviceTaint{{Key: "fgpu.dev/allocator", Value: "required", Effect: resourceapi.DeviceTaintEffectNoSchedule}},
			})
		}
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// Claim is bench claim i.
func (o Options) Claim(i int) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: fmt.Sprintf("%s-claim-%05d", o.Prefix, i)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu",
			Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: o.Class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(o.Sizes[i%len(o.Sizes)])}}}}}}}}
}

// Pod is bench pod i: it uses claim i and tolerates the bench nodes' taint (no kubelet
// runs there, so it never starts; binding is what counts).
func (o Options) Pod(i int) *corev1.Pod {
	claim := fmt.Sprintf("%s-claim-%05d", o.Prefix, i)
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: fmt.Sprintf("%s-pod-%05d", o.Prefix, i), Labels: map[string]string{"app": "fgpu-bench"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"fgpu.dev/bench": "true"},
			// Tolerate every taint: the bench nodes never report Ready.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers: []corev1.Container{{Name: "c", Image: "fgpu.dev/pause:dev", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m")}, Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: &claim}},
		}}
}

// Burst creates the claims (and pods) and waits until each is allocated or Timeout.
func Burst(ctx context.Context, c kubernetes.Interface, o Options) (Report, error) {
	rep := Report{Claims: o.Claims}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w0, err := c.ResourceV1().ResourceClaims(o.Namespace).Watch(wctx, metav1.ListOptions{})
	if err != nil {
		return rep, err
	}
	var mu sync.Mutex
	createdAt := map[string]time.Time{}
	allocatedAt := map[string]time.Time{}
	seen := func(cl *resourceapi.ResourceClaim) int {
		mu.Lock()
		defer mu.Unlock()
		if cl.Status.Allocation != nil {
			if _, ok := allocatedAt[cl.Name]; !ok {
				allocatedAt[cl.Name] = time.Now()
			}
		}
		return len(allocatedAt)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w, rv := w0, ""
		for {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Added && ev.Type != watch.Modified {
					continue
				}
				cl, ok := ev.Object.(*resourceapi.ResourceClaim)
				if !ok {
					continue
				}
				rv = cl.ResourceVersion
				if seen(cl) >= o.Claims {
					w.Stop()
					return
				}
			}
			// The API server ends watches that fall behind (a busy machine): watch again
			// from where this one stopped, or list when that is too old.
			if wctx.Err() != nil {
				return
			}
			var err error
			if w, err = c.ResourceV1().ResourceClaims(o.Namespace).Watch(wctx, metav1.ListOptions{ResourceVersion: rv}); err == nil {
				continue
			}
			list, err := c.ResourceV1().ResourceClaims(o.Namespace).List(wctx, metav1.ListOptions{})
			if err != nil {
				return
			}
			n := 0
			for i := range list.Items {
				n = seen(&list.Items[i])
			}
			if n >= o.Claims {
				return
			}
			if w, err = c.ResourceV1().ResourceClaims(o.Namespace).Watch(wctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion}); err != nil {
				return
			}
		}
	}()
	start := time.Now()
	next := make(chan int)
	var wg sync.WaitGroup
	errs := make(chan error, o.Concurrency)
	for k := 0; k < max(o.Concurrency, 1); k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				cl := o.Claim(i)
				t := time.Now()
				if _, err := c.ResourceV1().ResourceClaims(o.Namespace).Create(ctx, cl, metav1.CreateOptions{}); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				createdAt[cl.Name] = t
				mu.Unlock()
				if o.Pods {
					if _, err := c.CoreV1().Pods(o.Namespace).Create(ctx, o.Pod(i), metav1.CreateOptions{}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	for i := 0; i < o.Claims; i++ {
		select {
		case next <- i:
		case err := <-errs:
			close(next)
			return rep, err
		}
	}
	close(next)
	wg.Wait()
	rep.Created = time.Since(start)
	select {
	case err := <-errs:
		return rep, err
	default:
	}
	select {
	case <-done:
	case <-time.After(o.Timeout):
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	var lat []time.Duration
	var last time.Time
	for name, a := range allocatedAt {
		if t, ok := createdAt[name]; ok {
			lat = append(lat, a.Sub(t))
			if a.After(last) {
				last = a
			}
		}
	}
	rep.Allocated = len(lat)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if n := len(lat); n > 0 {
		rep.P50 = lat[n/2]
		rep.P99 = lat[int(math.Ceil(float64(n)*0.99))-1]
		rep.Max = lat[n-1]
		rep.Elapsed = last.Sub(start)
		rep.PerSecond = float64(n) / rep.Elapsed.Seconds()
	}
	rep.InvariantErr = Check(ctx, c, o.Driver)
	return rep, nil
}

// Check runs invariant.CheckDriver over the live cluster.
func Check(ctx context.Context, c kubernetes.Interface, driver string) error {
	cl, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	sl, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	claims := make([]*resourceapi.ResourceClaim, len(cl.Items))
	for i := range cl.Items {
		claims[i] = &cl.Items[i]
	}
	slices := make([]*resourceapi.ResourceSlice, len(sl.Items))
	for i := range sl.Items {
		slices[i] = &sl.Items[i]
	}
	return invariant.CheckDriver(driver, claims, slices)
}

// Cleanup deletes the bench namespace, slices and nodes.
func Cleanup(ctx context.Context, c kubernetes.Interface, o Options) error {
	// No kubelet runs on the bench nodes to confirm a graceful deletion: delete the pods
	// at once, so that their claims are released (which needs the allocator running).
	zero := int64(0)
	_ = c.CoreV1().Pods(o.Namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	_ = c.CoreV1().Namespaces().Delete(ctx, o.Namespace, metav1.DeleteOptions{})
	// The claims go first (the allocator releases them), then the devices they were on:
	// the other way round leaves allocations to devices that no longer exist.
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		if _, err := c.CoreV1().Namespaces().Get(ctx, o.Namespace, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			break
		}
	}
	for i := 0; i < o.Nodes; i++ {
		_ = c.ResourceV1().ResourceSlices().Delete(ctx, o.NodeName(i)+"-gpus", metav1.DeleteOptions{})
		_ = c.CoreV1().Nodes().Delete(ctx, o.NodeName(i), metav1.DeleteOptions{})
	}
	return nil
}

// CreateAll creates every claim (and pod) of the burst without timing them: for a fake API
// server, whose watchers panic when they fall 100 events behind a fast creator.
func CreateAll(ctx context.Context, c kubernetes.Interface, o Options) error {
	for i := 0; i < o.Claims; i++ {
		if _, err := c.ResourceV1().ResourceClaims(o.Namespace).Create(ctx, o.Claim(i), metav1.CreateOptions{}); err != nil {
			return err
		}
		if o.Pods {
			if _, err := c.CoreV1().Pods(o.Namespace).Create(ctx, o.Pod(i), metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

// Await polls until every claim of the burst is allocated (or Timeout) and reports each
// claim's latency from start.
func Await(ctx context.Context, c kubernetes.Interface, o Options, start time.Time) Report {
	rep := Report{Claims: o.Claims}
	seen := map[string]time.Time{}
	deadline := start.Add(o.Timeout)
	for len(seen) < o.Claims && time.Now().Before(deadline) && ctx.Err() == nil {
		list, err := c.ResourceV1().ResourceClaims(o.Namespace).List(ctx, metav1.ListOptions{})
		if err == nil {
			now := time.Now()
			for i := range list.Items {
				if list.Items[i].Status.Allocation != nil {
					if _, ok := seen[list.Items[i].Name]; !ok {
						seen[list.Items[i].Name] = now
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	lat := make([]time.Duration, 0, len(seen))
	var last time.Time
	for _, t := range seen {
		lat = append(lat, t.Sub(start))
		if t.After(last) {
			last = t
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	rep.Allocated = len(lat)
	if n := len(lat); n > 0 {
		rep.P50, rep.P99, rep.Max = lat[n/2], lat[int(math.Ceil(float64(n)*0.99))-1], lat[n-1]
		rep.Elapsed = last.Sub(start)
		rep.PerSecond = float64(n) / rep.Elapsed.Seconds()
	}
	rep.InvariantErr = Check(ctx, c, o.Driver)
	return rep
}
