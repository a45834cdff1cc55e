package plugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// spareCheckEvery is how often the spares are looked at when nothing takes one.
const spareCheckEvery = 30 * time.Second

// spareDaemons keeps one MPS control daemon started ahead on each GPU, so that the first
// claim of an isolation domain on a GPU is prepared on a daemon that already answers instead
// of waiting for a new daemon's pod to start (most of a second of the pod's start). The claim
// takes the spare's key as its domain's, and a new spare is started behind it. A control
// daemon starts no MPS server before a client connects, so a spare holds no GPU memory; it
// was never any domain's, and its directories reach no container before a claim takes it.
// Only where daemons run in pods (a process starts at once). Its maps are guarded by State's
// lock, which is not held while a spare starts or stops.
type spareDaemons struct {
	mps     *mps.Manager
	mu      *sync.Mutex // State's lock
	l       *ledger
	foreign *foreignWatch
	devices map[string]gpu.Device

	// byGPU is each GPU's spare (by UUID), started or starting; ready those that answer.
	byGPU map[string]string
	ready map[string]bool
	kick  chan struct{}
	// node is this node as the watch last saw it (watchNode); nil outside a cluster.
	node     corelisters.NodeLister
	nodeName string
	// done is closed when run returns.
	done chan struct{}
}

func newSpareDaemons(m *mps.Manager, mu *sync.Mutex, l *ledger, foreign *foreignWatch, devices map[string]gpu.Device, nodeName string) *spareDaemons {
	return &spareDaemons{mps: m, mu: mu, l: l, foreign: foreign, devices: devices, nodeName: nodeName,
		byGPU: map[string]string{}, ready: map[string]bool{}, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// enabled: daemons start as pods, which is what a spare saves the wait for.
func (sp *spareDaemons) enabled() bool { return sp.mps.Launcher != nil }

// has says whether key is a spare no domain took. Caller holds State's lock.
func (sp *spareDaemons) has(key string) bool {
	for _, k := range sp.byGPU {
		if k == key {
			return true
		}
	}
	return false
}

// assign gives each planned MPS device (a claim has one at most) whose domain has no daemon
// on its GPU yet the GPU's ready spare, and starts a new one behind it. The caller holds
// State's lock from the ledger's last look at the domain's daemons (ledger.sameDomainDaemons)
// to the checkpoint's save of the plan, so that no other prepare of the domain can take a
// second daemon meanwhile: from the save on, the key is the domain's.
func (sp *spareDaemons) assign(ctx context.Context, planned []checkpoint.PreparedDevice) {
	used := sp.l.usedDaemons()
	for i := range planned {
		p := &planned[i]
		if p.MPSKey == "" || used[p.MPSKey] {
			continue
		}
		key, ok := sp.byGPU[p.GPUUUID]
		if !ok || !sp.ready[key] {
			continue
		}
		delete(sp.byGPU, p.GPUUUID)
		delete(sp.ready, key)
		if err := sp.mps.UnmarkSpare(key); err != nil {
			klog.FromContext(ctx).Error(err, "Marking an MPS daemon taken by a domain", "daemon", key)
		}
		p.MPSKey = key
		time.AfterFunc(spareRefillDelay, sp.kickNow)
	}
}

// spareRefillDelay: the spare behind a taken one starts this much later, not while the pod
// that took it starts: a daemon pod starting beside it slows the pod's own start by about
// as much as the spare saved it, where the node has few cores.
const spareRefillDelay = 3 * time.Second

// run keeps a spare on each GPU until ctx ends: at once, spareRefillDelay after each one taken, and every
// spareCheckEvery (a spare that stopped answering is replaced).
func (sp *spareDaemons) run(ctx context.Context) {
	defer close(sp.done)
	t := time.NewTicker(spareCheckEvery)
	defer t.Stop()
	for {
		sp.fill(ctx)
		select {
		case <-ctx.Done():
			return
		case <-sp.kick:
		case <-t.C:
		}
	}
}

// fill starts a spare on each GPU that has none, and replaces those that do not answer. A
// cordoned node (a drain, a node being retired) gets no spares, and loses those it has: a
// drain would evict them, and no new pod is scheduled there.
func (sp *spareDaemons) fill(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if sp.cordoned() {
		sp.mu.Lock()
		spares := maps.Clone(sp.byGPU)
		sp.mu.Unlock()
		for uuid, key := range spares {
			sp.drop(ctx, uuid, key)
		}
		return
	}
	for _, d := range sortedDevices(sp.devices) {
		sp.mu.Lock()
		key, ok := sp.byGPU[d.UUID]
		sp.mu.Unlock()
		if ok && sp.mps.Running(ctx, key) {
			continue
		}
		if ok {
			logger.Info("A spare MPS daemon does not answer; replacing it", "daemon", key, "gpu", d.UUID)
			sp.drop(ctx, d.UUID, key)
		}
		key, err := newSpareKey(d)
		if err != nil {
			logger.Error(err, "Starting a spare MPS daemon")
			return
		}
		sp.mu.Lock()
		sp.byGPU[d.UUID] = key
		sp.mu.Unlock()
		// Marked before it starts: a daemon found without the mark is a leak.
		if err := sp.mps.MarkSpare(key, false); err != nil {
			logger.Error(err, "Marking a spare MPS daemon", "daemon", key)
		}
		if _, err := sp.mps.Ensure(ctx, key, d.UUID, mps.Limits{}); err != nil {
			logger.Error(err, "Starting a spare MPS daemon; a domain's first claim on the GPU waits for a daemon of its own", "gpu", d.UUID)
			// Also when ctx ended (the plugin stops): a pod half started is not left behind.
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), spareStopTimeout)
			sp.drop(stopCtx, d.UUID, key)
			cancel()
			continue
		}
		servers := sp.foreign.serversOf(ctx, key)
		sp.mu.Lock()
		sp.foreign.own(servers)
		// Under the lock, so that a spare taken or dropped meanwhile is not marked again.
		if sp.byGPU[d.UUID] == key {
			sp.ready[key] = true
			if err := sp.mps.MarkSpare(key, true); err != nil {
				logger.Error(err, "Marking a spare MPS daemon ready", "daemon", key)
			}
		}
		sp.mu.Unlock()
		logger.V(2).Info("Started a spare MPS daemon", "daemon", key, "gpu", d.UUID)
	}
}

// watchNode watches this node for cordon (a drain, a node being retired): the spares go at
// once, and come back when it is uncordoned. It returns once the watch has seen the node.
func (sp *spareDaemons) watchNode(ctx context.Context, client kubernetes.Interface) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", sp.nodeName).String()
	}))
	inf := factory.Core().V1().Nodes().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(old, cur any) {
			if o, ok := old.(*corev1.Node); ok {
				if c, ok := cur.(*corev1.Node); ok && o.Spec.Unschedulable != c.Spec.Unschedulable {
					sp.kickNow()
				}
			}
		},
	}); err != nil {
		return err
	}
	sp.node = factory.Core().V1().Nodes().Lister()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return fmt.Errorf("watching node %s: %w", sp.nodeName, context.Cause(ctx))
	}
	return nil
}

// cordoned says whether the node is marked unschedulable, as the watch last saw it.
func (sp *spareDaemons) cordoned() bool {
	if sp.node == nil {
		return false
	}
	n, err := sp.node.Get(sp.nodeName)
	return err == nil && n.Spec.Unschedulable
}

func (sp *spareDaemons) kickNow() {
	select {
	case sp.kick <- struct{}{}:
	default:
	}
}

// stop waits for run to end and stops the spares no claim took: the plugin is going away
// (an upgrade, or an uninstall, after which nothing would stop them), and the next one starts
// its own.
func (sp *spareDaemons) stop(ctx context.Context) {
	<-sp.done
	sp.mu.Lock()
	keys := make([]string, 0, len(sp.byGPU))
	for _, k := range sp.byGPU {
		keys = append(keys, k)
	}
	clear(sp.byGPU)
	clear(sp.ready)
	sp.mu.Unlock()
	// Together, within the one timeout: a node may have many GPUs.
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() {
			if err := sp.mps.Stop(ctx, k); err != nil {
				klog.FromContext(ctx).Error(err, "Stopping a spare MPS daemon; the next plugin stops it", "daemon", k)
			}
		})
	}
	wg.Wait()
}

// drop stops a spare that is still one (not taken meanwhile) and forgets it.
func (sp *spareDaemons) drop(ctx context.Context, uuid, key string) {
	sp.mu.Lock()
	if sp.byGPU[uuid] != key {
		sp.mu.Unlock()
		return
	}
	delete(sp.byGPU, uuid)
	delete(sp.ready, key)
	sp.mu.Unlock()
	if err := sp.mps.Stop(ctx, key); err != nil {
		klog.FromContext(ctx).Error(err, "Stopping a spare MPS daemon; it is stopped with the other daemons no claim uses", "daemon", key)
	}
}

// newSpareKey is a fresh key for a spare on GPU d: random, so that it names no daemon
// that ever was, and in the shape mps.Manager accepts.
func newSpareKey(d gpu.Device) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("spare MPS daemon key: %w", err)
	}
	return fmt.Sprintf("%sgpu%d_%s", mps.SparePrefix, d.Index, hex.EncodeToString(b[:])), nil
}

func sortedDevices(m map[string]gpu.Device) []gpu.Device {
	out := make([]gpu.Device, 0, len(m))
	for _, d := range m {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b gpu.Device) int { return a.Index - b.Index })
	return out
}
