// Package replay drives the real allocator (its informers, decide and write) over a fake
// API server loaded with an openb trace, in the order fgpu sim replays it, and compares
// the GPU allocation ratio it reaches with the simulator's on the same seed. Nodes and
// ResourceSlices come from the node list; each arriving pod of the pod list becomes a
// ResourceClaim and a pod that uses it, created and synced one at a time, as fgpu sim
// places one pod at a time.
//
// It counts the API writes the allocator makes (verb and resource, events included) and
// the process CPU the placements cost, so that writes and CPU per placed claim can be
// compared before and after a change.
//
// What differs from a cluster: nothing binds the pods (the allocator counts them as
// assumed on their node, as it does until kube-scheduler binds them), no clock runs (no
// allocation times out), and CPU-only pods are left out (kube-scheduler, not the
// allocator, places them), so the simulator is given the same GPU pods.
package replay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"os"
	goruntime "runtime"
	"runtime/metrics"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/fgpu-dev/fgpu/test/performance/loadgen"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sim"
)

// Namespace holds every replayed claim and pod: one tenant, as the simulator has.
const Namespace = "replay"

// gpuMemory is each GPU's published memory: 1000 memory steps, so a share of m milli-GPU is
// exactly m steps and the allocator sizes it in the core as the trace does.
var gpuMemory = 1000 * api.MemoryStep

// Config is one replay.
type Config struct {
	Nodes []placement.NodeSpec
	Pods  []placement.Request // GPU pods only (GPUPods)
	Seed  int64
	Tune  float64
	// Fills are the allocation ratios at which decision times are reported separately
	// (e.g. 0.5 and 0.9: claims decided while the ratio was below each).
	Fills []float64
	// Until, when positive, stops the replay once the allocation ratio reaches it (a
	// large fleet's decisions at a given fill, without replaying the rest).
	Until float64
	// Requeue looks again at every claim still waiting after each placement, as the
	// controller's kick does when capacity changes: what a waiting claim costs in writes
	// under a burst.
	Requeue bool
	// HeapProfile, when set, is where the heap in use at the end (the allocator and the fake
	// API server both still live) is written, for go tool pprof: which of the two holds it.
	HeapProfile string
	// Memory measures, at the end, the allocator's share of the live heap (slow: it
	// copies every object of the fake API server).
	Memory bool
}

// Report is a replay's outcome.
type Report struct {
	Arrived, Placed int
	// Alloc is the GPU allocation ratio at the end (allocated GPU share / capacity).
	Alloc float64
	// Sync is how long the informers took to sync the nodes and slices, and First the
	// first decision after it.
	Sync, First time.Duration
	// Decisions are the times of the Sync calls that decided on a claim (the decision
	// and its writes to the fake API server), by fill band: Decisions[i] holds those
	// made while the ratio was below Fills[i] and at or above Fills[i-1].
	Decisions [][]time.Duration
	// API is, for each of those Sync calls, the time spent inside the fake API server
	// (its reads, writes and watch notifications): Sync minus API is the allocator's.
	API [][]time.Duration
	// Writes counts the allocator's API writes by verb and resource ("update
	// resourceclaims/status", "create events"): every create, update, patch and delete
	// but the replay's own creates of claims and pods. Events are counted once the
	// recorder has sent them.
	Writes map[string]int
	// Digest is a SHA-256 over every decision in arrival order (the claim, its devices and
	// node, or its status annotation when it waits): two replays decided alike when their
	// digests are equal.
	Digest string
	// CPU is the process's CPU time (user and system) from the first claim to the last
	// event sent, and InAPI the part of it spent inside the fake API server (its wall
	// time: it runs synchronously in the caller), both over every claim arrived.
	CPU, InAPI time.Duration
	// GCCycles are the garbage collections that ended over the same span, and GCCPU the
	// CPU the runtime counts as the collector's (its workers, the allocations' assists
	// and the pauses; runtime/metrics' estimate): the process's heap is mostly the fake
	// API server's, so this is what the fake costs the allocator's decisions.
	GCCycles  uint64
	GCCPU     time.Duration
	Invariant error
	// LiveHeap is the heap the live objects take after a GC at the end, the allocator and the fake API
	// server (every claim, pod and event) both still live.
	LiveHeap uint64
	// AllocatorHeap (with Config.Memory) is the allocator's part of the live heap at the
	// end: what the heap held before the replay started, the fake server's log of every
	// request and a copy of the fake server's objects taken away from LiveHeap.
	AllocatorHeap uint64
}

// WritesTotal is the number of writes the allocator made.
func (r *Report) WritesTotal() int {
	n := 0
	for _, v := range r.Writes {
		n += v
	}
	return n
}

// GPUPods are the pods of a trace that ask for GPUs: the ones the allocator places.
func GPUPods(pods []placement.Request) []placement.Request {
	out := make([]placement.Request, 0, len(pods))
	for _, p := range pods {
		if p.GPUs > 0 {
			out = append(out, p)
		}
	}
	return out
}

// Sim is fgpu sim --learn on the same nodes, pods and seed: the figure the replay must match.
func Sim(cfg Config) (*sim.Result, error) {
	lo := placement.DefaultLearnOptions()
	return sim.Run(sim.Config{Nodes: cfg.Nodes, Pods: cfg.Pods, Policy: "fgpu", Seed: cfg.Seed, Tune: cfg.Tune, Learn: &lo})
}

// Run replays the trace through the allocator.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	core, err := placement.NewCluster(cfg.Nodes)
	if err != nil {
		return nil, err
	}
	seq := sim.Arrivals(cfg.Pods, core.GPUCapacity(), cfg.Tune, cfg.Seed)
	var before uint64
	if cfg.Memory {
		before = liveHeap()
	}
	client := fake.NewSimpleClientset() // NewClientset's field management would dominate
	if err := setup(ctx, client, cfg.Nodes); err != nil {
		return nil, err
	}
	// Every request goes through the tracker as the default reactor would send it, timed,
	// and the allocator's writes are counted.
	var inAPI atomic.Int64
	w := &writes{n: map[string]int{}}
	react := k8stesting.ObjectReaction(client.Tracker())
	client.PrependReactor("*", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		t0 := time.Now()
		handled, obj, err := react(a)
		inAPI.Add(int64(time.Since(t0)))
		w.add(a)
		return handled, obj, err
	})
	ccfg := controller.DefaultConfig()
	frozen := time.Now()
	ccfg.Now = func() time.Time { return frozen }
	c := controller.New(ccfg, client, nil, nil)
	c.RecordEvents(ctx)
	start := time.Now()
	if !c.WaitForCacheSync(ctx) {
		return nil, errors.New("informer caches did not sync")
	}
	rep := &Report{Arrived: len(seq), Decisions: make([][]time.Duration, len(cfg.Fills)+1), API: make([][]time.Duration, len(cfg.Fills)+1)}
	rep.Sync = time.Since(start)
	w.reset()
	cpu0, api0 := processCPU(), inAPI.Load()
	gc0, gcCPU0 := gcStats()
	capa := float64(core.GPUCapacity())
	var allocated int64
	var waiting []string
	digest := sha256.New()
	for i, k := range seq {
		if cfg.Until > 0 && float64(allocated)/capa >= cfg.Until {
			rep.Arrived = i
			break
		}
		pod := &cfg.Pods[k]
		claim, p := objects(i, pod)
		if _, err := client.ResourceV1().ResourceClaims(Namespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if _, err := client.CoreV1().Pods(Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		key := Namespace + "/" + claim.Name
		// The informers show the claim and its pod a moment later: sync until the
		// allocator has decided on it (allocated it, or said why it waits).
		for deadline := time.Now().Add(time.Minute); ; {
			api0 := inAPI.Load()
			t0 := time.Now()
			if _, err := c.Sync(ctx, key); err != nil {
				return nil, fmt.Errorf("sync %s: %w", key, err)
			}
			el := time.Since(t0)
			apiTime := time.Duration(inAPI.Load() - api0)
			got, err := client.ResourceV1().ResourceClaims(Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
			if err != nil {
				return nil, err
			}
			if _, ok := got.Annotations[api.AnnotationStatus]; ok {
				if i == 0 {
					rep.First = time.Since(start)
				}
				band := sort.SearchFloat64s(cfg.Fills, float64(allocated)/capa+1e-12)
				rep.Decisions[band] = append(rep.Decisions[band], el)
				rep.API[band] = append(rep.API[band], apiTime)
				record(digest, got)
				if got.Status.Allocation == nil {
					waiting = append(waiting, key)
					break
				}
				rep.Placed++
				allocated += pod.GPUDemand()
				if cfg.Requeue {
					waiting, err = requeue(ctx, c, client, waiting)
					if err != nil {
						return nil, err
					}
				}
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the allocator did not decide on %s within a minute", key)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	w.settle(5 * time.Second)
	rep.CPU, rep.InAPI = processCPU()-cpu0, time.Duration(inAPI.Load()-api0)
	gc1, gcCPU1 := gcStats()
	rep.GCCycles, rep.GCCPU = gc1-gc0, gcCPU1-gcCPU0
	rep.Writes = w.snapshot()
	rep.Alloc = float64(allocated) / capa
	rep.Digest = hex.EncodeToString(digest.Sum(nil))
	rep.Invariant = loadgen.Check(ctx, client, api.DriverName)
	rep.LiveHeap = liveHeap()
	if cfg.HeapProfile != "" {
		if err := writeHeapProfile(cfg.HeapProfile); err != nil {
			return nil, err
		}
	}
	if cfg.Memory {
		client.ClearActions() // the fake's log of every request: an API server keeps none
		end := liveHeap()
		store, err := copyStore(ctx, client)
		if err != nil {
			return nil, err
		}
		server := liveHeap() - end
		goruntime.KeepAlive(store)
		rep.AllocatorHeap = end - min(end, before+server)
	}
	goruntime.KeepAlive(c)
	return rep, nil
}

// liveHeap is the heap the live objects take, after a collection.
func liveHeap() uint64 {
	goruntime.GC()
	var ms goruntime.MemStats
	goruntime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// copyStore is a fake clientset holding a copy of every object c holds: the size of c's
// store.
func copyStore(ctx context.Context, c *fake.Clientset) (*fake.Clientset, error) {
	var objs []runtime.Object
	nss, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	classes, err := c.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	nodes, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	claims, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	events, err := c.CoreV1().Events("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for i := range nss.Items {
		objs = append(objs, &nss.Items[i])
	}
	for i := range classes.Items {
		objs = append(objs, &classes.Items[i])
	}
	for i := range nodes.Items {
		objs = append(objs, &nodes.Items[i])
	}
	for i := range slices.Items {
		objs = append(objs, &slices.Items[i])
	}
	for i := range claims.Items {
		objs = append(objs, &claims.Items[i])
	}
	for i := range pods.Items {
		objs = append(objs, &pods.Items[i])
	}
	for i := range events.Items {
		objs = append(objs, &events.Items[i])
	}
	return fake.NewSimpleClientset(objs...), nil
}

// writeHeapProfile writes the heap profile to path.
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// record adds a decided claim to the digest: where it went, or why it waits.
func record(h hash.Hash, claim *resourceapi.ResourceClaim) {
	fmt.Fprintf(h, "%s\n", claim.Name)
	a := claim.Status.Allocation
	if a == nil {
		fmt.Fprintf(h, "waits: %s\n", claim.Annotations[api.AnnotationStatus])
		return
	}
	for _, d := range a.Devices.Results {
		fmt.Fprintf(h, "%s %s %s %v\n", d.Request, d.Pool, d.Device, d.ConsumedCapacity)
	}
	if a.NodeSelector != nil {
		fmt.Fprintf(h, "%s\n", a.NodeSelector.String())
	}
}

// requeue syncs each waiting claim once and returns those still waiting.
func requeue(ctx context.Context, c *controller.Controller, client *fake.Clientset, waiting []string) ([]string, error) {
	still := waiting[:0]
	for _, key := range waiting {
		if _, err := c.Sync(ctx, key); err != nil {
			return nil, fmt.Errorf("sync %s: %w", key, err)
		}
		ns, name, _ := strings.Cut(key, "/")
		got, err := client.ResourceV1().ResourceClaims(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		if got.Status.Allocation == nil {
			still = append(still, key)
		}
	}
	return still, nil
}

// objects are arrival i's claim and pod: a share of one GPU of the shared class, or whole
// GPUs of the exclusive class; the pod asks the trace's CPU and memory.
func objects(i int, r *placement.Request) (*resourceapi.ResourceClaim, *corev1.Pod) {
	name := fmt.Sprintf("p%06d", i)
	req := &resourceapi.ExactDeviceRequest{AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: int64(r.GPUs)}
	if r.Whole() || r.Share >= placement.DefaultGPUCapacity {
		req.DeviceClassName = api.DeviceClassExclusive
	} else {
		req.DeviceClassName = api.DeviceClassShared
		// Compute 0 (uncapped): the trace has GPU shares only, and compute derived from
		// memory rounds up, which would refuse a GPU the trace fills exactly.
		req.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			api.CapacityMemory:  *resource.NewQuantity(r.Share*api.MemoryStep, resource.BinarySI),
			api.CapacityCompute: resource.MustParse("0")}}
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, UID: types.UID("claim-" + name)},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: req}}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: Namespace, Name: name, UID: types.UID("pod-" + name)},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(r.CPUMilli, resource.DecimalSI),
					corev1.ResourceMemory: *resource.NewQuantity(r.MemoryMiB<<20, resource.BinarySI)},
				Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(name)}}}}
	return claim, pod
}

// setup creates the namespace, the two DeviceClasses, and a Node and fenced ResourceSlice
// per node of the trace.
func setup(ctx context.Context, c *fake.Clientset, nodes []placement.NodeSpec) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	for _, name := range []string{api.DeviceClassShared, api.DeviceClassExclusive} {
		class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", api.DriverName)}}}}}
		if _, err := c.ResourceV1().DeviceClasses().Create(ctx, class, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	mem := *resource.NewQuantity(gpuMemory, resource.BinarySI)
	for _, n := range nodes {
		alloc := corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(n.CPUMilli, resource.DecimalSI),
			corev1.ResourceMemory: *resource.NewQuantity(n.MemoryMiB<<20, resource.BinarySI), corev1.ResourcePods: resource.MustParse("10000")}
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{"kubernetes.io/hostname": n.Name}},
			Status: corev1.NodeStatus{Allocatable: alloc, Capacity: alloc}}
		if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			return err
		}
		if len(n.GPUs) == 0 {
			continue
		}
		s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: n.Name + "-" + api.DriverName},
			Spec: resourceapi.ResourceSliceSpec{Driver: api.DriverName, NodeName: ptr.To(n.Name), Pool: resourceapi.ResourcePool{Name: n.Name, ResourceSliceCount: 1}}}
		for g, gs := range n.GPUs {
			s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{Name: fmt.Sprintf("gpu-%d", g), AllowMultipleAllocations: ptr.To(true),
				Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"index": {IntValue: ptr.To(int64(g))}, "productName": {StringValue: ptr.To(gs.Model)}},
				Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
					api.CapacityMemory:  {Value: mem, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &mem}},
					api.CapacityCompute: {Value: resource.MustParse("100")}},
				Taints: []resourceapi.DeviceTaint{api.FenceTaint()}})
		}
		if _, err := c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// writes counts the allocator's writes by verb and resource.
type writes struct {
	mu   sync.Mutex
	n    map[string]int
	last time.Time // of the last write counted
}

func (w *writes) add(a k8stesting.Action) {
	verb, res := a.GetVerb(), a.GetResource().Resource
	switch verb {
	case "create", "update", "patch", "delete", "delete-collection":
	default:
		return
	}
	if verb == "create" && a.GetSubresource() == "" && (res == "resourceclaims" || res == "pods") {
		return // the replay's own: the allocator creates neither
	}
	if sub := a.GetSubresource(); sub != "" {
		res += "/" + sub
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.n[verb+" "+res]++
	w.last = time.Now()
}

func (w *writes) reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	clear(w.n)
}

// settle waits until nothing was written for 200ms (the event recorder sends events from
// its own goroutine, after the Sync that recorded them), or at most d.
func (w *writes) settle(d time.Duration) {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		w.mu.Lock()
		quiet := time.Since(w.last) > 200*time.Millisecond
		w.mu.Unlock()
		if quiet {
			return
		}
	}
}

func (w *writes) snapshot() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[string]int, len(w.n))
	for k, v := range w.n {
		out[k] = v
	}
	return out
}

// WritesTable lists the writes by kind, with each kind's count per placed claim.
func (r *Report) WritesTable() string {
	keys := make([]string, 0, len(r.Writes))
	for k := range r.Writes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	per := func(n int) float64 { return float64(n) / float64(max(r.Placed, 1)) }
	for _, k := range keys {
		fmt.Fprintf(&b, "  %-34s %7d  %.2f per placed claim\n", k, r.Writes[k], per(r.Writes[k]))
	}
	fmt.Fprintf(&b, "  %-34s %7d  %.2f per placed claim\n", "all writes", r.WritesTotal(), per(r.WritesTotal()))
	return b.String()
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// gcStats are the garbage collections ended so far and the CPU the runtime counts as
// the collector's.
func gcStats() (cycles uint64, cpu time.Duration) {
	m := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(m)
	if m[0].Value.Kind() == metrics.KindUint64 {
		cycles = m[0].Value.Uint64()
	}
	if m[1].Value.Kind() == metrics.KindFloat64 {
		cpu = time.Duration(m[1].Value.Float64() * float64(time.Second))
	}
	return cycles, cpu
}

// PeakRSS is the process's peak resident set (VmHWM), where /proc has it: what a replay cost
// in memory, allocator, fake API server and simulator together.
func PeakRSS() string {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return "unknown"
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}
