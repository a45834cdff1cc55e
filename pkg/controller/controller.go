// Package controller is fgpu's allocator: it watches pending ResourceClaims of fgpu's
// DeviceClasses and decides, under the SharingPolicies, which GPU each one shares, with whom,
// how much memory and compute it gets and in which mode; then writes status.allocation
// itself (kube-scheduler honours it). See DESIGN.md, "The allocation fence".
package controller

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
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

	mu       sync.Mutex
	st       *state
	policies map[string]*api.SharingPolicy
	pending  map[string]time.Time // claim key → created
	// firstLook: claim key → when the controller first looked at the claim and whether it has
	// decided on it (with its pods) since; see olderClaimUndecided.
	firstLook   map[string]firstLook
	quotaWait   map[string]map[string]time.Time
	lastMsg     map[string]string
	avoid       map[types.UID]map[string]bool // pod → nodes where its allocation timed out
	assumedPods map[types.UID]assumedPod
	// nodeAssumed sums assumedPods' requests per node, so that a decision's pod-fit check
	// costs O(1) per node instead of a walk over every assumed pod.
	nodeAssumed map[string]podfit.Requests
	// nodeReq sums the requests of the pods bound to each node (podBound: which pod adds what).
	nodeReq  map[string]podfit.Requests
	podBound map[types.UID]boundPod
	cel      *cel.Cache
	// selIDs interns CEL selector expressions for the per-GPU memo; selGen changes when it
	// starts over. Guarded by mu.
	selIDs map[string]int
	selGen int
	// nodeVerdicts keeps podfit's FitsNode verdicts by pod constraints and core node
	// index (fitsNode). Guarded by mu.
	nodeVerdicts map[string][]nodeVerdict
	requeueAll   chan struct{}
	metrics      *Metrics
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
		pending: map[string]time.Time{}, firstLook: map[string]firstLook{}, quotaWait: map[string]map[string]time.Time{}, lastMsg: map[string]string{},
		avoid: map[types.UID]map[string]bool{}, assumedPods: map[types.UID]assumedPod{}, nodeAssumed: map[string]podfit.Requests{}, nodeReq: map[string]podfit.Requests{}, podBound: map[types.UID]boundPod{},
		cel: cel.NewCache(100, cel.Features{EnableConsumableCapacity: true}), selIDs: map[string]int{}, nodeVerdicts: map[string][]nodeVerdict{}, requeueAll: make(chan struct{}, 1), metrics: m}
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
