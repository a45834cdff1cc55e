// Package controller is fgpu's allocator: it watches pending ResourceClaims of fgpu's
// DeviceClasses and decides, under the SharingPolicies, which GPU each one shares, with whom,
// how much memory and compute it gets and in which mode; then writes status.allocation
// itself (kube-scheduler honours it). docs/design.md describes the allocation fence, the
// assumed claims and the quota queue.
//
// A pending claim goes one way: Sync → place: gather (pods, classes, policy) → the quota
// queue's gate (claimqueue) → decide (decider, in one model transaction: quota, GPU fit,
// node fit through the pod ledger, the placement core) → commit (write the allocation,
// report). The state each step keeps has one owner type with its own lock:
// claimqueue.Queue, podledger.Ledger, model.Model (the GPUs, the shares on them, the
// placement core; changed only through its methods and transactions), statusMemo
// (status.go); the decider (decide.go; quota.go, gpufit.go, nodefit.go) keeps only memos
// and reads and reserves through the transaction it is given.
//
// Beside that path, the sizing loops read the claims' usage reports: sizingLoop (sizing.go;
// burst.go, autosize.go, consolidate.go) recommends sizes, sizes bursting shares for the
// decider and under sizing Auto recreates pods; idleScaler (idle.go) scales idle workloads
// to zero. Each gets what it reads and writes from New: the decider, place's gather, and
// the decider as placementPath for the sizing loop. So do the smaller parts the handlers
// and Sync call on: statusTeller (status.go), goneClaims (gone.go) and the SharingPolicy
// status writer policyStatus (policystatus.go).
package controller

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/controller/claimqueue"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/controller/podledger"
	"github.com/fgpu-dev/fgpu/pkg/gang"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

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
	// Namespace is the allocator's (the chart's), where the kubelet plugins keep what they
	// observe of the GPU pods fgpu did not place (api.ObservedUsage); "": not read.
	Namespace string
	// ExtendedResource is what the GPU pods fgpu did not place ask NVIDIA's device plugin for
	// (the chart's extendedResource.name): the before and after of sizing (adoption.go)
	// counts the GPUs they hold from it. "": adoption.DefaultExtendedResource.
	ExtendedResource string
	// GangTopologyKeys are the node labels, nearest first, by which a gang's next pod is
	// placed near its other pods (pkg/gang); none: gangs are not kept together.
	GangTopologyKeys []string
	// Fence, when set, is asked before every write to the API server (allocations,
	// deallocations, finalizers, status): a replica that may no longer lead must not write.
	// cmd/fgpu-allocator passes its leader election's (pkg/leader).
	Fence interface{ Allow() error }
	Now   func() time.Time
	// Sizing sets the recommender that sizes workloads from their claims' measured use
	// (zero: sizing.DefaultOptions).
	Sizing sizing.Options
	// SizingShrinkAfter: under sizing Auto, a pod whose use stayed far below its cap this
	// long is recreated smaller.
	SizingShrinkAfter time.Duration
	// SizingReportInterval is the kubelet plugin's usage report interval: burst admission
	// lines up the shares' use per interval of this length, over SizingBurstWindow.
	SizingReportInterval time.Duration
	SizingBurstWindow    time.Duration
	// Selectors bounds what evaluating claims' CEL selectors may cost (zero:
	// selectors.DefaultOptions).
	Selectors selectors.Options
}

// DefaultConfig is the allocator's default configuration.
func DefaultConfig() Config {
	return Config{DriverName: api.DriverName, DeviceClasses: []string{api.DeviceClassShared, api.DeviceClassExclusive},
		ExclusiveClasses: []string{api.DeviceClassExclusive}, BindTimeout: 2 * time.Minute, OrphanGrace: 30 * time.Second,
		Workers: 32, Placement: "fgpu", GangTopologyKeys: gang.DefaultTopologyKeys, Sizing: sizing.DefaultOptions(), SizingShrinkAfter: time.Hour,
		SizingReportInterval: 5 * time.Minute, SizingBurstWindow: 24 * time.Hour}
}

func (cfg *Config) isFgpuClass(name string) bool { return slices.Contains(cfg.DeviceClasses, name) }
func (cfg *Config) isExclusiveClass(name string) bool {
	return slices.Contains(cfg.ExclusiveClasses, name)
}

// isOurs reports whether any request of the claim names an fgpu class.
func (cfg *Config) isOurs(claim *resourceapi.ResourceClaim) bool {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if cfg.isFgpuClass(a.class) {
				return true
			}
		}
	}
	return false
}

// Controller is the allocator.
type Controller struct {
	cfg    Config
	client kubernetes.Interface
	listers
	informers *informerSet
	queue     workqueue.TypedRateLimitingInterface[string] // claim keys to Sync

	pending *claimqueue.Queue
	ledger  *podledger.Ledger
	model   *model.Model
	refused *refusedGPUs
	// restores rate-limits restoring a claim's finalizer.
	restores *finalizerRestores
	// status tells where a claim stands; gone holds the shares of claims deleted while
	// their pods run.
	status *statusTeller
	gone   *goneClaims

	selectors  *selectors.Evaluator
	shares     *decisionShare
	recorder   record.EventRecorder
	bcast      record.EventBroadcaster
	requeueAll chan struct{}
	metrics    *Metrics

	// policyStatus writes SharingPolicy status; nil without an fgpu client.
	policyStatus *policyStatus

	// decider decides, in a model transaction, where a pending claim goes.
	decider *decider
	// reclaim takes back GPUs that namespaces granted allowSharedGPU hold beyond what their
	// quota pays for, for a claim that waits for them.
	reclaim *reclaimer
	// sizing recommends workload sizes from measured use and, under sizing Auto, resizes,
	// relieves and consolidates; idle scales idle workloads to zero.
	sizing *sizingLoop
	idle   *idleScaler
}

// New builds the controller and its informers (not started). fgpuClient reads the
// SharingPolicies; nil means none (benchmarks).
func New(cfg Config, client kubernetes.Interface, fgpuClient versioned.Interface, m *Metrics) *Controller {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Workers = max(cfg.Workers, 1)
	if cfg.Selectors.ClaimBudget == 0 {
		cfg.Selectors = selectors.DefaultOptions(cfg.DriverName)
	}
	if cfg.Selectors.Now == nil {
		cfg.Selectors.Now = cfg.Now
	}
	c := &Controller{cfg: cfg, client: client,
		pending: claimqueue.New(), ledger: podledger.New(), model: model.New(cfg.DriverName), refused: newRefusedGPUs(),
		restores: newFinalizerRestores(), selectors: selectors.New(cfg.Selectors), shares: newDecisionShare(), requeueAll: make(chan struct{}, 1), metrics: m}
	if c.metrics == nil {
		c.metrics = NewMetrics(nil)
	}
	c.metrics.ctrl = c
	if cfg.Sizing == (sizing.Options{}) {
		cfg.Sizing = sizing.DefaultOptions()
		c.cfg.Sizing = cfg.Sizing
	}
	if cfg.SizingReportInterval <= 0 {
		cfg.SizingReportInterval, c.cfg.SizingReportInterval = 5*time.Minute, 5*time.Minute
	}
	if cfg.SizingBurstWindow < cfg.SizingReportInterval {
		cfg.SizingBurstWindow, c.cfg.SizingBurstWindow = 24*time.Hour, 24*time.Hour
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(
		workqueue.NewTypedMaxOfRateLimiter(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second)),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "fgpu-claims"})
	c.informers = newInformerSet(client, fgpuClient, c.handlers(), cfg.Namespace)
	c.listers = c.informers.listers
	c.bcast = record.NewBroadcaster()
	c.recorder = c.bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "fgpu-allocator"})
	if fgpuClient != nil {
		c.policyStatus = &policyStatus{queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Second, 5*time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "fgpu-policies"}),
			policies: c.policies, client: fgpuClient, recorder: c.recorder}
	}
	c.status = &statusTeller{memo: newStatusMemo(), client: client, recorder: c.recorder, fenced: c.fenced}
	c.gone = &goneClaims{byKey: map[string]map[types.UID]podRef{}, listers: c.listers, model: c.model, recorder: c.recorder, kick: c.kick}
	c.idle = &idleScaler{spans: engine.NewIdle[workloadRef](),
		cfg: &c.cfg, listers: c.listers, model: c.model, client: client, recorder: c.recorder, fenced: c.fenced, kick: c.kick}
	burst := engine.NewHistory[model.GPUKey](sizing.Clock{Width: cfg.SizingReportInterval, Window: max(1, int(cfg.SizingBurstWindow/cfg.SizingReportInterval))})
	c.reclaim = newReclaimer(c.listers, client, c.recorder, c.metrics, c.now, c.fenced, func(key string, after time.Duration) { c.queue.AddAfter(key, after) })
	c.decider = &decider{cfg: &c.cfg, memo: newFitMemos(), ledger: c.ledger, nodes: c.nodes, refused: c.refused, burst: burst, reserveText: c.idle.reserveText,
		reclaim: c.reclaim}
	c.sizing = &sizingLoop{sizer: newSizer(cfg.Sizing, cfg.SizingShrinkAfter), burst: burst,
		cfg: &c.cfg, listers: c.listers, model: c.model, pending: c.pending, gather: c.gather, place: c.decider, client: client, recorder: c.recorder, metrics: c.metrics, fenced: c.fenced}
	// Consolidation asks the decider, which sizes bursting shares as the sizing loop says.
	c.decider.sizeBurst = c.sizing.sizeBurst
	return c
}

func (c *Controller) now() time.Time { return c.cfg.Now() }

// fenced says why the controller may not write now (nil: it may).
func (c *Controller) fenced() error {
	if c.cfg.Fence == nil {
		return nil
	}
	return c.cfg.Fence.Allow()
}

// Run starts the informers and workers and blocks until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer c.queue.ShutDown()
	c.RecordEvents(ctx)
	logger.Info("Waiting for caches")
	if !c.WaitForCacheSync(ctx) {
		return fmt.Errorf("informer caches did not sync")
	}
	logger.Info("Caches synced; placing claims", "workers", c.cfg.Workers)
	c.kick()
	for range c.cfg.Workers {
		go wait.UntilWithContext(ctx, c.worker, time.Second)
	}
	go c.requeueLoop(ctx)
	if c.policyStatus != nil {
		defer c.policyStatus.queue.ShutDown()
		go c.policyStatus.worker(ctx)
	}
	go wait.UntilWithContext(ctx, c.expire, 10*time.Second)
	go wait.UntilWithContext(ctx, c.sizing.sweepUsage, usageSweepInterval)
	go wait.UntilWithContext(ctx, c.sizing.evictForResize, autoEvictInterval)
	go wait.UntilWithContext(ctx, c.sizing.consolidate, c.cfg.SizingReportInterval)
	go wait.UntilWithContext(ctx, c.sizing.countAdoption, min(adoptionInterval, c.cfg.SizingReportInterval))
	go wait.UntilWithContext(ctx, c.idle.scaleIdle, idleInterval)
	<-ctx.Done()
	return nil
}

// RecordEvents sends the controller's events to the API server (and its log) until ctx
// ends. Run does; callers that drive Sync by hand call it to see them.
func (c *Controller) RecordEvents(ctx context.Context) {
	c.bcast.StartStructuredLogging(3)
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.client.CoreV1().Events("")})
	context.AfterFunc(ctx, c.bcast.Shutdown)
}

// Recommendation is the recommender's current size for a workload.
func (c *Controller) Recommendation(w api.SizingWorkload) (api.SizingRecommendation, bool) {
	return c.sizing.Recommendation(w)
}

// Synced reports whether the informers have synced (Run then places claims).
func (c *Controller) Synced() bool { return c.informers.synced() }

// WaitForCacheSync starts the informers and waits for them; tests that drive Sync by hand
// call it instead of Run.
func (c *Controller) WaitForCacheSync(ctx context.Context) bool {
	c.informers.start(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.informers.hasSynced...) {
		return false
	}
	// Observed usage names pods: read it once the pods are known, or a node's report
	// would wait for its next write.
	c.informers.startObserved(ctx)
	return true
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
	c.pending.NewPass(c.now())
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
		for _, k := range c.pending.InOrder("") {
			c.queue.Add(k)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// requeueNamespace looks again, oldest first, at a namespace's pending claims (one left
// the head of its quota queue).
func (c *Controller) requeueNamespace(ns, except string) {
	for _, k := range c.pending.InOrder(ns) {
		if k != except {
			c.queue.Add(k)
		}
	}
}

// expire forgets pods assumed long past the bind timeout: neither bound nor deleted while
// the allocator watched, and releases deleted claims' shares whose pods ended unseen.
func (c *Controller) expire(context.Context) {
	c.ledger.Expire(c.now().Add(-(c.cfg.BindTimeout + time.Minute)))
	c.gone.recheck(nil)
}
