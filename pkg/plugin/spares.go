package plugin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"time"

	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// SparePrefix begins the key of every spare MPS daemon. A spare keeps its key when a domain
// takes it: the key is a directory name, and only the checkpoint says whose a daemon is.
const SparePrefix = "spare-"

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
	// done is closed when run returns.
	done chan struct{}
}

func newSpareDaemons(m *mps.Manager, mu *sync.Mutex, l *ledger, foreign *foreignWatch, devices map[string]gpu.Device) *spareDaemons {
	return &spareDaemons{mps: m, mu: mu, l: l, foreign: foreign, devices: devices,
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

// assign gives each planned MPS device whose domain has no daemon on its GPU yet the GPU's
// ready spare, and starts a new one behind it. Caller holds State's lock, and saves the
// plan in the checkpoint before releasing it: from then on the key is the domain's.
func (sp *spareDaemons) assign(planned []checkpoint.PreparedDevice) {
	for i := range planned {
		p := &planned[i]
		if p.MPSKey == "" || sp.l.usedDaemons()[p.MPSKey] {
			continue
		}
		key, ok := sp.byGPU[p.GPUUUID]
		if !ok || !sp.ready[key] {
			continue
		}
		delete(sp.byGPU, p.GPUUUID)
		delete(sp.ready, key)
		p.MPSKey = key
		select {
		case sp.kick <- struct{}{}:
		default:
		}
	}
}

// run keeps a spare on each GPU until ctx ends: at once, after each one taken, and every
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

// fill starts a spare on each GPU that has none, and replaces those that do not answer.
func (sp *spareDaemons) fill(ctx context.Context) {
	logger := klog.FromContext(ctx)
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
		sp.ready[key] = true
		sp.mu.Unlock()
		logger.V(2).Info("Started a spare MPS daemon", "daemon", key, "gpu", d.UUID)
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
	for _, k := range keys {
		if err := sp.mps.Stop(ctx, k); err != nil {
			klog.FromContext(ctx).Error(err, "Stopping a spare MPS daemon; the next plugin stops it", "daemon", k)
		}
	}
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
	return fmt.Sprintf("%sgpu%d_%s", SparePrefix, d.Index, hex.EncodeToString(b[:])), nil
}

func sortedDevices(m map[string]gpu.Device) []gpu.Device {
	out := make([]gpu.Device, 0, len(m))
	for _, d := range m {
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b gpu.Device) int { return a.Index - b.Index })
	return out
}
