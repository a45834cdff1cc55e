// Package controller is fgpu's allocator: it watches pending ResourceClaims of fgpu's
// DeviceClasses and decides, under the SharingPolicies, which GPU each one shares, with whom,
// how much memory and compute it gets and in which mode; then writes status.allocation
// itself (kube-scheduler honours it). See DESIGN.md, "The allocation fence".
package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// SharingPolicyGVR is the SharingPolicy resource.
var SharingPolicyGVR = schema.GroupVersionResource{Group: api.GroupName, Version: "v1alpha1", Resource: api.SharingPolicyResource}

// Config configures the controller.
type Config struct {
	DriverName       string
	DeviceClasses    []string // classes whose claims the allocator places
	ExclusiveClasses []string // classes whose requests take whole GPUs
	// BindTimeout is how long an allocation may wait for its pod to be scheduled before
	// the allocator takes it back and places the claim elsewhere.
	BindTimeout time.Duration
	// OrphanGrace is how long an allocation with no pod left may stay.
	OrphanGrace time.Duration
	Workers     int
	// Placement is the placement core's policy for standard claims (fgpu, fgd, bestfit).
	Placement string
	Now       func() time.Time
}

// DefaultConfig is the allocator's default configuration.
func DefaultConfig() Config {
	return Config{DriverName: "gpu.fgpu.dev", DeviceClasses: []string{"gpu.fgpu.dev", "exclusive.gpu.fgpu.dev"},
		ExclusiveClasses: []string{"exclusive.gpu.fgpu.dev"}, BindTimeout: 2 * time.Minute, OrphanGrace: 30 * time.Second,
		Workers: 32, Placement: "fgpu"}
}

const (
	indexPodClaim = "claim"
	indexPodNode  = "node"
)

// Controller is the allocator.
type Controller struct {
	cfg      Config
	client   kubernetes.Interface
	dyn      dynamic.Interface
	factory  informers.SharedInformerFactory
	dfactory dynamicinformer.DynamicSharedInformerFactory
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder record.EventRecorder
	bcast    record.EventBroadcaster

	claims   resourcelisters.ResourceClaimLister
	classes  resourcelisters.DeviceClassLister
	nodes    corelisters.NodeLister
	pods     corelisters.PodLister
	nsLister corelisters.NamespaceLister
	podIndex cache.Indexer
	slices   cache.Indexer
	synced   []cache.InformerSynced

	mu          sync.Mutex
	st          *state
	policies    map[string]*api.SharingPolicy
	pending     map[string]time.Time // claim key → created
	quotaWait   map[string]map[string]time.Time
	lastMsg     map[string]string
	avoid       map[types.UID]map[string]bool // pod → nodes where its allocation timed out
	assumedPods map[types.UID]assumedPod
	// nodeAssumed sums assumedPods' requests per node, so that a decision's pod-fit check
	// costs O(1) per node instead of a walk over every assumed pod.
	nodeAssumed map[string]podfit.Requests
	// nodeReq sums the requests of the pods bound to each node (podBound: which pod adds what).
	nodeReq    map[string]podfit.Requests
	podBound   map[types.UID]boundPod
	cel        *cel.Cache
	requeueAll chan struct{}
	metrics    *Metrics
}

// New builds the controller and its informers (not started).
func New(cfg Config, client kubernetes.Interface, dyn dynamic.Interface, m *Metrics) *Controller {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	c := &Controller{cfg: cfg, client: client, dyn: dyn, st: newState(), policies: map[string]*api.SharingPolicy{},
		pending: map[string]time.Time{}, quotaWait: map[string]map[string]time.Time{}, lastMsg: map[string]string{},
		avoid: map[types.UID]map[string]bool{}, assumedPods: map[types.UID]assumedPod{}, nodeAssumed: map[string]podfit.Requests{}, nodeReq: map[string]podfit.Requests{}, podBound: map[types.UID]boundPod{},
		cel: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}), requeueAll: make(chan struct{}, 1), metrics: m}
	if c.metrics == nil {
		c.metrics = NewMetrics(nil)
	}
	c.metrics.ctrl = c
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second)),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "fgpu-claims"})

	strip := func(obj any) (any, error) {
		if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
			a.GetObjectMeta().SetManagedFields(nil)
		}
		return obj, nil
	}
	c.factory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(strip))
	claimInf := c.factory.Resource().V1().ResourceClaims()
	sliceInf := c.factory.Resource().V1().ResourceSlices()
	classInf := c.factory.Resource().V1().DeviceClasses()
	nodeInf := c.factory.Core().V1().Nodes()
	podInf := c.factory.Core().V1().Pods()
	nsInf := c.factory.Core().V1().Namespaces()
	c.claims, c.classes, c.nodes, c.pods, c.nsLister = claimInf.Lister(), classInf.Lister(), nodeInf.Lister(), podInf.Lister(), nsInf.Lister()
	_ = podInf.Informer().AddIndexers(cache.Indexers{
		indexPodClaim: func(obj any) ([]string, error) {
			p := obj.(*corev1.Pod)
			names := podClaimNames(p)
			out := make([]string, len(names))
			for i, n := range names {
				out[i] = p.Namespace + "/" + n
			}
			return out, nil
		},
		indexPodNode: func(obj any) ([]string, error) {
			p := obj.(*corev1.Pod)
			if p.Spec.NodeName == "" {
				return nil, nil
			}
			return []string{p.Spec.NodeName}, nil
		},
	})
	c.podIndex = podInf.Informer().GetIndexer()
	_ = sliceInf.Informer().AddIndexers(cache.Indexers{indexPodNode: func(obj any) ([]string, error) {
		s := obj.(*resourceapi.ResourceSlice)
		return []string{sliceNode(s)}, nil
	}})
	c.slices = sliceInf.Informer().GetIndexer()

	_, _ = claimInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.onClaim(nil, o.(*resourceapi.ResourceClaim)) },
		UpdateFunc: func(o, n any) { c.onClaim(o.(*resourceapi.ResourceClaim), n.(*resourceapi.ResourceClaim)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if cl, ok := o.(*resourceapi.ResourceClaim); ok {
				c.onClaimDelete(cl)
			}
		},
	})
	sliceHandler := func(o any) {
		if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
			o = t.Obj
		}
		if s, ok := o.(*resourceapi.ResourceSlice); ok && s.Spec.Driver == c.cfg.DriverName {
			c.onSlices(sliceNode(s))
		}
	}
	_, _ = sliceInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: sliceHandler,
		UpdateFunc: func(_, n any) { sliceHandler(n) }, DeleteFunc: sliceHandler})
	anyChange := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { c.kick() }, UpdateFunc: func(any, any) { c.kick() }, DeleteFunc: func(any) { c.kick() }}
	_, _ = classInf.Informer().AddEventHandler(anyChange)
	_, _ = nsInf.Informer().AddEventHandler(anyChange)
	_, _ = nodeInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { c.kick() },
		UpdateFunc: func(o, n any) {
			on, nn := o.(*corev1.Node), n.(*corev1.Node)
			if on.Spec.Unschedulable != nn.Spec.Unschedulable || len(on.Spec.Taints) != len(nn.Spec.Taints) ||
				!equalLabels(on.Labels, nn.Labels) || on.Status.Allocatable.Cpu().Cmp(*nn.Status.Allocatable.Cpu()) != 0 {
				c.kick()
			}
		},
		DeleteFunc: func(any) { c.kick() },
	})
	_, _ = podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { c.onPod(nil, o.(*corev1.Pod)) },
		UpdateFunc: func(o, n any) { c.onPod(o.(*corev1.Pod), n.(*corev1.Pod)) },
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				c.onPodDelete(p)
			}
		},
	})
	c.synced = []cache.InformerSynced{claimInf.Informer().HasSynced, sliceInf.Informer().HasSynced, classInf.Informer().HasSynced,
		nodeInf.Informer().HasSynced, podInf.Informer().HasSynced, nsInf.Informer().HasSynced}
	if dyn != nil {
		c.dfactory = dynamicinformer.NewDynamicSharedInformerFactory(dyn, 0)
		pInf := c.dfactory.ForResource(SharingPolicyGVR).Informer()
		_, _ = pInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.onPolicy(o, false) },
			UpdateFunc: func(_, n any) { c.onPolicy(n, false) },
			DeleteFunc: func(o any) { c.onPolicy(o, true) },
		})
		c.synced = append(c.synced, pInf.HasSynced)
	}
	c.bcast = record.NewBroadcaster()
	c.recorder = c.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "fgpu-allocator"})
	return c
}

func equalLabels(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func sliceNode(s *resourceapi.ResourceSlice) string {
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		return *s.Spec.NodeName
	}
	return s.Spec.Pool.Name
}

func (c *Controller) now() time.Time { return c.cfg.Now() }

func (c *Controller) isFgpuClass(name string) bool {
	for _, n := range c.cfg.DeviceClasses {
		if n == name {
			return true
		}
	}
	return false
}

func (c *Controller) isExclusiveClass(name string) bool {
	for _, n := range c.cfg.ExclusiveClasses {
		if n == name {
			return true
		}
	}
	return false
}

// isOurs reports whether any request of the claim names an fgpu class.
func (c *Controller) isOurs(claim *resourceapi.ResourceClaim) bool {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if c.isFgpuClass(a.class) {
				return true
			}
		}
	}
	return false
}

func (c *Controller) schedPolicy(l api.LatencyClass) placement.Policy {
	switch l {
	case api.LatencyCritical:
		return spread{}
	case api.LatencyBestEffort:
		return pack{}
	}
	p, err := placement.New(c.cfg.Placement, defaultWorkload())
	if err != nil {
		p, _ = placement.New("fgpu", defaultWorkload())
	}
	return p
}

// Run starts the informers and workers and blocks until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	c.bcast.StartStructuredLogging(3)
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	defer c.bcast.Shutdown()
	c.factory.Start(ctx.Done())
	if c.dfactory != nil {
		c.dfactory.Start(ctx.Done())
	}
	logger.Info("Waiting for caches")
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("informer caches did not sync")
	}
	logger.Info("Caches synced; placing claims", "workers", c.cfg.Workers)
	c.kick()
	for i := 0; i < c.cfg.Workers; i++ {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	go c.requeueLoop(ctx)
	go wait.UntilWithContext(ctx, c.expire, 10*time.Second)
	<-ctx.Done()
	return nil
}

// Synced reports whether the informers have synced (Run then places claims).
func (c *Controller) Synced() bool {
	for _, f := range c.synced {
		if !f() {
			return false
		}
	}
	return true
}

// WaitForCacheSync starts the informers (without workers) and waits for them: for tests
// that drive Sync by hand.
func (c *Controller) WaitForCacheSync(ctx context.Context) bool {
	c.factory.Start(ctx.Done())
	if c.dfactory != nil {
		c.dfactory.Start(ctx.Done())
	}
	return cache.WaitForCacheSync(ctx.Done(), c.synced...)
}

func (c *Controller) worker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	requeueAfter, err := c.Sync(ctx, key)
	switch {
	case err != nil:
		klog.FromContext(ctx).V(3).Info("Sync failed, retrying", "claim", key, "err", err)
		c.queue.AddRateLimited(key)
	default:
		c.queue.Forget(key)
		if requeueAfter > 0 {
			c.queue.AddAfter(key, requeueAfter)
		}
	}
	return true
}

// kick asks for every pending claim to be looked at again (capacity, nodes or policies
// changed); bursts of kicks collapse into one pass.
func (c *Controller) kick() {
	select {
	case c.requeueAll <- struct{}{}:
	default:
	}
}

func (c *Controller) requeueLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.requeueAll:
		}
		for _, k := range c.pendingInOrder("") {
			c.queue.Add(k)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// pendingInOrder lists pending claims (of one namespace, or all), oldest first.
func (c *Controller) pendingInOrder(ns string) []string {
	c.mu.Lock()
	type kv struct {
		k string
		t time.Time
	}
	list := make([]kv, 0, len(c.pending))
	for k, t := range c.pending {
		if ns == "" || strings.HasPrefix(k, ns+"/") {
			list = append(list, kv{k, t})
		}
	}
	c.mu.Unlock()
	sort.Slice(list, func(i, j int) bool {
		return list[i].t.Before(list[j].t) || (list[i].t.Equal(list[j].t) && list[i].k < list[j].k)
	})
	out := make([]string, len(list))
	for i, e := range list {
		out[i] = e.k
	}
	return out
}

// expire drops bookkeeping of pods that are gone or bound.
func (c *Controller) expire(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for uid, ap := range c.assumedPods {
		if c.now().Sub(ap.at) > c.cfg.BindTimeout+time.Minute {
			c.dropAssumed(uid)
		}
	}
}

func (c *Controller) onClaim(old, claim *resourceapi.ResourceClaim) {
	if !c.isOurs(claim) && claim.Status.Allocation == nil {
		return
	}
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	freed := c.account(claim)
	c.mu.Unlock()
	if freed {
		c.kick()
	}
	if c.isOurs(claim) {
		c.queue.Add(key)
	}
}

// account brings the state in line with a claim seen by the informer; it reports whether
// capacity was freed. Caller holds c.mu.
func (c *Controller) account(claim *resourceapi.ResourceClaim) bool {
	cur := c.st.claims[claimKey(claim)]
	if claim.Status.Allocation == nil {
		if cur == nil {
			return false
		}
		if !cur.assumed.IsZero() && c.now().Sub(cur.assumed) < 30*time.Second {
			return false // our own write, not yet seen by the informer
		}
		c.st.remove(claimKey(claim))
		return true
	}
	rec := c.recordFromClaim(claim)
	if rec == nil {
		return false
	}
	if cur != nil && sameShares(cur, rec) {
		cur.assumed = time.Time{}
		return false
	}
	c.st.add(rec)
	return cur != nil
}

func sameShares(a, b *claimRec) bool {
	if len(a.shares) != len(b.shares) {
		return false
	}
	for i := range a.shares {
		if a.shares[i].t.shareID != b.shares[i].t.shareID || a.shares[i].gpu != b.shares[i].gpu || a.shares[i].t.mem != b.shares[i].t.mem {
			return false
		}
	}
	return true
}

func (c *Controller) onClaimDelete(claim *resourceapi.ResourceClaim) {
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	freed := c.st.remove(claimKey(claim)) != nil
	delete(c.pending, key)
	delete(c.lastMsg, key)
	leftQueue := false
	if q := c.quotaWait[claim.Namespace]; q != nil {
		if _, ok := q[key]; ok {
			delete(q, key)
			leftQueue = true
		}
	}
	c.mu.Unlock()
	if freed {
		c.kick()
	}
	if leftQueue {
		c.requeueNamespace(claim.Namespace, key)
	}
}

// requeueNamespace looks again, oldest first, at a namespace's pending claims (one left
// the head of its quota queue).
func (c *Controller) requeueNamespace(ns, except string) {
	for _, k := range c.pendingInOrder(ns) {
		if k != except {
			c.queue.Add(k)
		}
	}
}

func (c *Controller) onSlices(node string) {
	objs, _ := c.slices.ByIndex(indexPodNode, node)
	devs := map[string]resourceapi.Device{}
	for _, o := range objs {
		s := o.(*resourceapi.ResourceSlice)
		if s.Spec.Driver != c.cfg.DriverName {
			continue
		}
		for _, d := range s.Spec.Devices {
			devs[d.Name] = d
		}
	}
	c.mu.Lock()
	c.st.setNodeDevices(node, devs)
	c.mu.Unlock()
	c.kick()
}

func (c *Controller) onPod(old, pod *corev1.Pod) {
	names := podClaimNames(pod)
	for _, o := range pod.OwnerReferences {
		_ = o
	}
	c.mu.Lock()
	c.trackBound(pod, false)
	if pod.Spec.NodeName != "" {
		c.dropAssumed(pod.UID)
	}
	c.mu.Unlock()
	if old != nil && podfit.Counts(old) && !podfit.Counts(pod) {
		c.kick() // the pod finished: its node's CPU and memory are free
	}
	for _, n := range names {
		c.queue.Add(pod.Namespace + "/" + n)
	}
	// Template claims: the claim is owned by the pod.
	if old == nil || len(old.Status.ResourceClaimStatuses) != len(pod.Status.ResourceClaimStatuses) {
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				c.queue.Add(pod.Namespace + "/" + *s.ResourceClaimName)
			}
		}
	}
}

func (c *Controller) onPodDelete(pod *corev1.Pod) {
	c.mu.Lock()
	c.trackBound(pod, true)
	c.dropAssumed(pod.UID)
	delete(c.avoid, pod.UID)
	c.mu.Unlock()
	for _, n := range podClaimNames(pod) {
		c.queue.Add(pod.Namespace + "/" + n)
	}
	c.kick()
}

func (c *Controller) onPolicy(o any, deleted bool) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	c.mu.Lock()
	if deleted {
		delete(c.policies, u.GetName())
	} else {
		var p api.SharingPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err == nil {
			c.policies[p.Name] = &p
		}
	}
	c.mu.Unlock()
	c.kick()
}

// SetPolicy adds or replaces a policy directly (tests without a dynamic client).
func (c *Controller) SetPolicy(p *api.SharingPolicy) {
	c.mu.Lock()
	c.policies[p.Name] = p.DeepCopy()
	c.mu.Unlock()
	c.kick()
}

// consumers returns the pods that use a claim: by name in their spec or status, or as the
// claim's owner.
func (c *Controller) consumers(claim *resourceapi.ResourceClaim) []*corev1.Pod {
	seen := map[types.UID]bool{}
	var out []*corev1.Pod
	objs, _ := c.podIndex.ByIndex(indexPodClaim, claim.Namespace+"/"+claim.Name)
	for _, o := range objs {
		p := o.(*corev1.Pod)
		if !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	for _, ref := range claim.OwnerReferences {
		if ref.Kind != "Pod" || ref.Controller == nil || !*ref.Controller {
			continue
		}
		if p, err := c.pods.Pods(claim.Namespace).Get(ref.Name); err == nil && p.UID == ref.UID && !seen[p.UID] {
			seen[p.UID] = true
			out = append(out, p)
		}
	}
	live := out[:0]
	for _, p := range out {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			live = append(live, p)
		}
	}
	return live
}

// Sync looks at one claim: places it, times its allocation out, or releases it.
func (c *Controller) Sync(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := strings.Cut(key, "/")
	claim, err := c.claims.ResourceClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		c.mu.Lock()
		delete(c.pending, key)
		c.mu.Unlock()
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if !c.isOurs(claim) {
		return 0, nil
	}
	logger := klog.FromContext(ctx).WithValues("claim", klog.KObj(claim))
	ctx = klog.NewContext(ctx, logger)
	if claim.DeletionTimestamp != nil {
		c.mu.Lock()
		delete(c.pending, key)
		c.mu.Unlock()
		return 0, c.finishDeletion(ctx, claim)
	}
	if claim.Status.Allocation != nil {
		c.mu.Lock()
		delete(c.pending, key)
		leftQueue := false
		if q := c.quotaWait[ns]; q != nil {
			if _, ok := q[key]; ok {
				delete(q, key)
				leftQueue = true
			}
		}
		c.mu.Unlock()
		if leftQueue {
			c.requeueNamespace(ns, key)
		}
		return c.checkAllocated(ctx, claim)
	}
	return c.place(ctx, claim)
}

func (c *Controller) place(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	logger := klog.FromContext(ctx)
	key := claim.Namespace + "/" + claim.Name
	pods := c.consumers(claim)
	in := &input{claim: claim, nodeFit: map[string]error{}, classes: map[string]*resourceapi.DeviceClass{}}
	var podLabels map[string]string
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			in.bound = p.Spec.NodeName
		} else {
			in.pods = append(in.pods, p)
		}
		if podLabels == nil {
			podLabels = p.Labels
			if podLabels == nil {
				podLabels = map[string]string{}
			}
		}
	}
	c.mu.Lock()
	if _, ok := c.pending[key]; !ok {
		c.pending[key] = claim.CreationTimestamp.Time
	}
	c.mu.Unlock()
	if len(pods) == 0 {
		return 0, nil // placed once a pod uses it (pod events requeue the claim)
	}
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if cl, err := c.classes.Get(a.class); err == nil {
				in.classes[a.class] = cl
			}
		}
	}
	var nsLabels map[string]string
	if nsObj, err := c.nsLister.Get(claim.Namespace); err == nil {
		nsLabels = nsObj.Labels
	}
	if nsLabels == nil {
		nsLabels = map[string]string{}
	}

	start := c.now()
	c.mu.Lock()
	if rec := c.st.claims[key]; rec != nil {
		// The state holds an allocation the informer has not shown yet (our own write):
		// never decide twice for one claim. A record the informer contradicts for long is
		// dropped (account keeps fresh ones only).
		if rec.assumed.IsZero() || c.now().Sub(rec.assumed) < 30*time.Second {
			c.mu.Unlock()
			return 100 * time.Millisecond, nil
		}
		c.st.remove(key)
	}
	pols := make([]*api.SharingPolicy, 0, len(c.policies))
	for _, p := range c.policies {
		pols = append(pols, p)
	}
	in.pol = policy.Resolve(pols, nsLabels, podLabels)
	in.avoid = map[string]bool{}
	for _, p := range pods {
		for n := range c.avoid[p.UID] {
			in.avoid[n] = true
		}
	}
	// Quota queue: strict FIFO per namespace, as Kueue's StrictFIFO.
	var d *decision
	var w *waitReason
	if in.pol.QuotaMemory != nil || in.pol.QuotaCompute != nil {
		for other, created := range c.quotaWait[claim.Namespace] {
			if other != key && (created.Before(claim.CreationTimestamp.Time) || (created.Equal(claim.CreationTimestamp.Time) && other < key)) {
				w = &waitReason{reason: ReasonQuotaQueued, message: fmt.Sprintf("queued behind claim %s, which waits for quota in namespace %s (claims are placed in creation order)", other, claim.Namespace)}
				break
			}
		}
	}
	if w == nil {
		d, w = c.decide(ctx, in)
	}
	leftQueue := false
	if w != nil && w.quota {
		if c.quotaWait[claim.Namespace] == nil {
			c.quotaWait[claim.Namespace] = map[string]time.Time{}
		}
		c.quotaWait[claim.Namespace][key] = claim.CreationTimestamp.Time
	} else if q := c.quotaWait[claim.Namespace]; q != nil {
		// Placed, or waiting for something else than quota: claims queued behind it go on.
		if _, ok := q[key]; ok {
			delete(q, key)
			leftQueue = true
		}
	}
	if w == nil {
		for _, p := range in.pods {
			c.setAssumed(p.UID, assumedPod{node: d.node, req: podfit.PodRequests(p), at: c.now()})
		}
	}
	c.mu.Unlock()
	c.metrics.decision.Observe(c.now().Sub(start).Seconds())
	if leftQueue {
		c.requeueNamespace(claim.Namespace, key)
	}

	if w != nil {
		logger.V(4).Info("Claim waits", "reason", w.reason, "message", w.message)
		c.setStatus(ctx, claim, pods, "Pending: "+w.message, w.reason)
		if w.quota {
			return 0, nil // requeued when quota frees up
		}
		return 0, nil // requeued on any capacity, node or policy change
	}
	msg := describe(d)
	if err := c.write(ctx, claim, d, "Allocated: "+msg); err != nil {
		c.mu.Lock()
		c.st.remove(claimKey(claim))
		for _, p := range in.pods {
			c.dropAssumed(p.UID)
		}
		c.mu.Unlock()
		c.kick()
		return 0, err
	}
	c.mu.Lock()
	delete(c.pending, key)
	c.mu.Unlock()
	c.metrics.placed.Inc()
	c.metrics.latency.Observe(c.now().Sub(claim.CreationTimestamp.Time).Seconds())
	logger.V(2).Info("Placed claim", "node", d.node, "summary", msg)
	written := claim.DeepCopy() // its status annotation went out with the finalizer
	if written.Annotations == nil {
		written.Annotations = map[string]string{}
	}
	written.Annotations[AnnotationStatus] = "Allocated: " + msg
	c.setStatus(ctx, written, pods, "Allocated: "+msg, ReasonPlaced)
	return c.cfg.BindTimeout, nil
}

// describe is the placement in words: "placed on node-1/gpu-3: 10Gi, 12% compute, MPS
// (domain ns-a), 2 co-tenants".
func describe(d *decision) string {
	parts := make([]string, 0, len(d.results))
	for _, r := range d.results {
		s := fmt.Sprintf("placed on %s: ", r.gpu.key)
		if r.whole {
			s += "whole GPU (" + fmtBytes(r.mem) + ")"
		} else {
			s += fmt.Sprintf("%s, %d%% compute, %s (domain %s), %d co-tenant(s)", fmtBytes(r.mem), r.comp, modeName(r.mode), r.domain, r.coTenants)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ") + " [" + d.pol.DisplayName() + "]"
}

func modeName(m api.SharingMode) string {
	if m == api.SharingModeTimeSlicing {
		return "time-slicing (memory not enforced)"
	}
	return "MPS"
}

// write pins the claim: finalizers and markers first, then the allocation, both guarded by
// the resourceVersion the decision was made on.
func (c *Controller) write(ctx context.Context, claim *resourceapi.ResourceClaim, d *decision, status string) error {
	cl := claim.DeepCopy()
	changed := false
	for _, f := range []string{Finalizer, resourceapi.Finalizer} {
		if !hasFinalizer(cl, f) {
			cl.Finalizers = append(cl.Finalizers, f)
			changed = true
		}
	}
	ten, _ := json.Marshal(tenancyOf(d.pol))
	if cl.Annotations == nil {
		cl.Annotations = map[string]string{}
	}
	if cl.Annotations[AnnotationAllocatedBy] != AllocatedByValue || cl.Annotations[AnnotationTenancy] != string(ten) || cl.Annotations[AnnotationStatus] != status {
		cl.Annotations[AnnotationAllocatedBy] = AllocatedByValue
		cl.Annotations[AnnotationTenancy] = string(ten)
		// Written with the finalizer, in the same request: setStatus then has nothing to patch.
		cl.Annotations[AnnotationStatus] = status
		changed = true
	}
	if changed {
		updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("add finalizer: %w", err)
		}
		cl = updated
	}
	alloc, err := c.allocation(claim, d)
	if err != nil {
		return err
	}
	cl.Status.Allocation = alloc
	updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("write allocation: %w", err)
	}
	c.mu.Lock()
	if cur := c.st.claims[claimKey(claim)]; cur != nil {
		cur.assumed = c.now()
	}
	_ = updated
	c.mu.Unlock()
	return nil
}

// allocation builds status.allocation for a decision.
func (c *Controller) allocation(claim *resourceapi.ResourceClaim, d *decision) (*resourceapi.AllocationResult, error) {
	a := &resourceapi.AllocationResult{
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{d.node}}},
		}}},
		AllocationTimestamp: &metav1.Time{Time: c.now()},
	}
	seenClass := map[string]bool{}
	for _, r := range d.results {
		sid := r.shareID
		a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: r.request, Driver: c.cfg.DriverName, Pool: r.gpu.key.pool, Device: r.gpu.key.device,
			Tolerations: r.tolerations, ShareID: &sid,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				capMemory:  *resource.NewQuantity(r.mem, resource.BinarySI),
				capCompute: *resource.NewQuantity(r.comp, resource.DecimalSI),
			},
		})
		// The class's configs, as kube-scheduler copies them.
		if cls := c.classOfRequest(claim, r.request); cls != "" && !seenClass[r.request] {
			seenClass[r.request] = true
			if class, err := c.classes.Get(cls); err == nil {
				for _, cc := range class.Spec.Config {
					a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
						Source: resourceapi.AllocationConfigSourceClass, Requests: []string{r.request}, DeviceConfiguration: cc.DeviceConfiguration})
				}
			}
		}
	}
	// The user's own claim configs, kept.
	for _, cc := range claim.Spec.Devices.Config {
		a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: cc.Requests, DeviceConfiguration: cc.DeviceConfiguration})
	}
	// The allocator's config last: it overrides what the policy decides (mode, domain).
	for _, r := range d.results {
		cfg := api.GpuConfig{TypeMeta: metav1.TypeMeta{APIVersion: api.SchemeGroupVersion.String(), Kind: api.GpuConfigKind},
			Mode: r.mode, IsolationDomain: r.domain}
		if r.userCfg != nil {
			if r.userCfg.MemoryLimit != nil && r.userCfg.MemoryLimit.Value() <= r.mem {
				cfg.MemoryLimit = r.userCfg.MemoryLimit
			}
			if p := r.userCfg.ComputePercent; p != nil && (r.comp == 0 || int64(*p) <= r.comp) {
				cfg.ComputePercent = p
			}
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{r.request},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: c.cfg.DriverName, Parameters: runtime.RawExtension{Raw: raw}}},
		})
	}
	return a, nil
}

func (c *Controller) classOfRequest(claim *resourceapi.ResourceClaim, request string) string {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if a.name == request {
				return a.class
			}
		}
	}
	return ""
}

// checkAllocated watches an allocation the allocator made: it takes it back when no pod
// uses the claim any more, or when its pod was not scheduled within BindTimeout (then the
// claim is placed again, away from that node for that pod).
func (c *Controller) checkAllocated(ctx context.Context, claim *resourceapi.ResourceClaim) (time.Duration, error) {
	if claim.Annotations[AnnotationAllocatedBy] != AllocatedByValue || !hasFinalizer(claim, Finalizer) {
		return 0, nil // kube-scheduler's: only accounted
	}
	if len(claim.Status.ReservedFor) > 0 {
		return 0, nil // in use; kube-controller-manager deallocates it when its pods are gone
	}
	at := claim.CreationTimestamp.Time
	if a := claim.Status.Allocation.AllocationTimestamp; a != nil {
		at = a.Time
	}
	age := c.now().Sub(at)
	pods := c.consumers(claim)
	if len(pods) == 0 {
		if age < c.cfg.OrphanGrace {
			return c.cfg.OrphanGrace - age, nil
		}
		return 0, c.deallocate(ctx, claim, nil, "no pod uses the claim any more")
	}
	if age < c.cfg.BindTimeout {
		return c.cfg.BindTimeout - age, nil
	}
	node := ""
	if a := claim.Status.Allocation; a != nil && a.NodeSelector != nil && len(a.NodeSelector.NodeSelectorTerms) == 1 &&
		len(a.NodeSelector.NodeSelectorTerms[0].MatchFields) == 1 && len(a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values) == 1 {
		node = a.NodeSelector.NodeSelectorTerms[0].MatchFields[0].Values[0]
	}
	why := ""
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			return c.cfg.BindTimeout, nil // bound; the scheduler reserves it
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse && cond.Message != "" {
				why = cond.Message
			}
		}
	}
	msg := fmt.Sprintf("the pod was not scheduled to node %s within %s", node, c.cfg.BindTimeout)
	if why != "" {
		msg += " (kube-scheduler: " + why + ")"
	}
	msg += "; placing the claim again elsewhere"
	c.mu.Lock()
	for _, p := range pods {
		if c.avoid[p.UID] == nil {
			c.avoid[p.UID] = map[string]bool{}
		}
		c.avoid[p.UID][node] = true
		c.dropAssumed(p.UID)
	}
	c.mu.Unlock()
	if err := c.deallocate(ctx, claim, pods, msg); err != nil {
		return 0, err
	}
	return 0, nil
}

// deallocate clears an allocation the allocator made.
func (c *Controller) deallocate(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, why string) error {
	cl := claim.DeepCopy()
	cl.Status.Allocation = nil
	cl.Status.Devices = nil
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("deallocate: %w", err)
	}
	klog.FromContext(ctx).V(2).Info("Deallocated claim", "why", why)
	c.mu.Lock()
	c.st.remove(claimKey(claim))
	c.mu.Unlock()
	reason := ReasonDeallocated
	if pods != nil {
		reason = ReasonTimedOut
	}
	c.recorder.Event(claim, corev1.EventTypeWarning, reason, why)
	for _, p := range pods {
		c.recorder.Event(p, corev1.EventTypeWarning, reason, fmt.Sprintf("claim %s: %s", claim.Name, why))
	}
	c.kick()
	c.queue.Add(claim.Namespace + "/" + claim.Name)
	return nil
}

// finishDeletion releases a deleted claim's allocation (once no pod holds it) and drops
// the allocator's finalizer.
func (c *Controller) finishDeletion(ctx context.Context, claim *resourceapi.ResourceClaim) error {
	if !hasFinalizer(claim, Finalizer) {
		return nil
	}
	if len(claim.Status.ReservedFor) > 0 {
		return nil // kube-controller-manager removes consumers that are gone; we see the update
	}
	cl := claim.DeepCopy()
	if cl.Status.Allocation != nil {
		cl.Status.Allocation = nil
		cl.Status.Devices = nil
		updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("deallocate deleted claim: %w", err)
		}
		cl = updated
		c.mu.Lock()
		c.st.remove(claimKey(claim))
		c.mu.Unlock()
		c.kick()
	}
	fs := cl.Finalizers[:0]
	for _, f := range cl.Finalizers {
		if f != Finalizer {
			fs = append(fs, f)
		}
	}
	cl.Finalizers = fs
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("remove finalizer: %w", err)
	}
	return nil
}

// setStatus tells people where a claim stands: events on the claim and its pods and the
// status annotation, each only when the message changed.
func (c *Controller) setStatus(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, msg string, reason ...string) {
	key := claim.Namespace + "/" + claim.Name
	c.mu.Lock()
	same := c.lastMsg[key] == msg
	c.lastMsg[key] = msg
	c.mu.Unlock()
	if same {
		return
	}
	if len(reason) > 0 {
		typ := corev1.EventTypeNormal
		if reason[0] != ReasonPlaced {
			typ = corev1.EventTypeWarning
		}
		c.recorder.Event(claim, typ, reason[0], msg)
		for _, p := range pods {
			c.recorder.Event(p, typ, reason[0], fmt.Sprintf("claim %s: %s", claim.Name, msg))
		}
	}
	if claim.Annotations[AnnotationStatus] == msg {
		return
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{AnnotationStatus: msg}}})
	if _, err := c.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Patching the claim's status annotation", "claim", klog.KObj(claim))
	}
}

// setAssumed records that the allocator pinned a pod to a node. Caller holds c.mu.
func (c *Controller) setAssumed(uid types.UID, ap assumedPod) {
	c.dropAssumed(uid)
	c.assumedPods[uid] = ap
	r := c.nodeAssumed[ap.node]
	r.Add(ap.req)
	c.nodeAssumed[ap.node] = r
}

// dropAssumed forgets a pinned pod. Caller holds c.mu.
func (c *Controller) dropAssumed(uid types.UID) {
	ap, ok := c.assumedPods[uid]
	if !ok {
		return
	}
	delete(c.assumedPods, uid)
	r := c.nodeAssumed[ap.node]
	r.Sub(ap.req)
	if r == (podfit.Requests{}) {
		delete(c.nodeAssumed, ap.node)
	} else {
		c.nodeAssumed[ap.node] = r
	}
}

type boundPod struct {
	node string
	req  podfit.Requests
}

// trackBound keeps nodeReq current as pods bind, finish or go. Caller holds c.mu.
func (c *Controller) trackBound(pod *corev1.Pod, deleted bool) {
	if b, ok := c.podBound[pod.UID]; ok {
		r := c.nodeReq[b.node]
		r.Sub(b.req)
		if r == (podfit.Requests{}) {
			delete(c.nodeReq, b.node)
		} else {
			c.nodeReq[b.node] = r
		}
		delete(c.podBound, pod.UID)
	}
	if deleted || !podfit.Counts(pod) {
		return
	}
	b := boundPod{node: pod.Spec.NodeName, req: podfit.PodRequests(pod)}
	c.podBound[pod.UID] = b
	r := c.nodeReq[b.node]
	r.Add(b.req)
	c.nodeReq[b.node] = r
}
