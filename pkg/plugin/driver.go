// Package plugin is fgpu's kubelet plugin: it publishes the node's GPUs as shareable
// devices and prepares claims for containers (MPS daemon, CDI spec, checkpoint).
package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// Driver implements kubeletplugin.DRAPlugin on top of State.
type Driver struct {
	state   *State
	client  kubernetes.Interface
	cfg     Config
	metrics *Metrics
	helper  *kubeletplugin.Helper
	health  *health
	// usage measures the prepared shares' GPU use; nil where the backend cannot.
	usage *usageMeter
	// observe measures the pods fgpu did not place (observe mode); nil without usage, or
	// where NVML shows the plugin no such process (OwnPIDNamespace) or it has no namespace.
	observe *observer
	ctx     context.Context
	cancel  context.CancelCauseFunc
	// evicting are the pods told they are evicted because their MPS server broke (only
	// watchMPS uses it).
	evicting map[types.UID]bool
}

// Start recovers the node's state, registers with the kubelet and publishes the GPUs. It
// returns once serving; Stop shuts it down.
func Start(ctx context.Context, cfg Config, backend gpu.Backend, client kubernetes.Interface, metrics *Metrics) (*Driver, error) {
	state, err := NewState(ctx, cfg, backend, client)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	d := &Driver{state: state, client: client, cfg: cfg, metrics: metrics, ctx: ctx, cancel: cancel,
		health: newHealth(ctx, cfg, backend, state.Devices())}
	state.caps.podEvent = d.podEvent
	state.caps.capChanged = d.capChanged
	// Set before the kubelet can call Prepare, which publishes the summaries.
	if source, ok := backend.(gpu.UsageSource); ok && cfg.usagePoll() > 0 {
		d.usage = newUsageMeter(source, "/proc", cfg.usageReport(), cfg.usageHeartbeat())
		if !cfg.OwnPIDNamespace && cfg.MPSPods.Namespace != "" {
			d.observe = newObserver(client, cfg.NodeName, cfg.MPSPods.Namespace, state.Devices(), cfg.usageReport(), cfg.usageHeartbeat())
		}
	}
	metrics.observeState(state)
	opts := []kubeletplugin.Option{
		kubeletplugin.DriverName(cfg.DriverName),
		kubeletplugin.NodeName(cfg.NodeName),
		kubeletplugin.KubeClient(client),
		// The helper would otherwise run one prepare or unprepare at a time on the node, and
		// a tenant can make its own domain's calls slow (a control socket that never
		// answers, a daemon that does not start): every other namespace's pod would wait
		// behind it. State takes its own locks, and releases them around daemon work.
		kubeletplugin.Serialize(false),
	}
	if cfg.PluginDataDir != "" {
		opts = append(opts, kubeletplugin.PluginDataDirectoryPath(cfg.PluginDataDir))
	}
	if cfg.RegistrarDir != "" {
		opts = append(opts, kubeletplugin.RegistrarDirectoryPath(cfg.RegistrarDir))
	}
	helper, err := kubeletplugin.Start(ctx, d, opts...)
	if err != nil {
		cancel(err)
		return nil, fmt.Errorf("start kubelet plugin: %w", err)
	}
	d.helper = helper
	if cfg.OwnPIDNamespace {
		klog.FromContext(ctx).Error(nil, ownPIDNamespaceMessage)
		if err := nodeEvent(ctx, client, cfg.NodeName, corev1.EventTypeWarning, ReasonOwnPIDNamespace, ownPIDNamespaceMessage); err != nil {
			klog.FromContext(ctx).Error(err, "Recording a Node event about the PID namespace")
		}
	}
	d.reportForeign(ctx, state.RefreshForeign(ctx))
	// A restart publishes the faults that still hold at once, and none that went.
	d.reportHealth(ctx, d.health.refresh(ctx))
	if err := d.publish(ctx); err != nil {
		helper.Stop()
		cancel(err)
		return nil, fmt.Errorf("publish ResourceSlices: %w", err)
	}
	if state.caps.active() || d.usage != nil || state.guards.enabled() {
		if err := d.watchPods(ctx); err != nil {
			helper.Stop()
			cancel(err)
			return nil, fmt.Errorf("watch this node's pods for their GPU memory cgroup caps, measured use and MPS daemons' clients: %w", err)
		}
	}
	go d.watchForeign(ctx)
	go d.watchHealth(ctx)
	go d.watchMPS(ctx)
	if state.spares.enabled() {
		if err := state.spares.watchNode(ctx, client); err != nil {
			helper.Stop()
			cancel(err)
			return nil, err
		}
		go state.spares.run(ctx)
	}
	if d.usage != nil {
		go d.watchUsage(ctx, cfg.usagePoll())
	}
	return d, nil
}

func (d *Driver) publish(ctx context.Context) error {
	devs := d.state.Devices()
	faults := map[string][]resourceapi.DeviceTaint{}
	for _, g := range devs {
		if t := d.health.taints(g.UUID); len(t) > 0 {
			faults[g.Name()] = t
		}
	}
	return d.helper.PublishResources(ctx, DriverResources(d.cfg.NodeName, devs, d.cfg.ReservedMemory, d.cfg.Fenced, d.state.Foreign(), faults, d.state.CgroupCaps()))
}

// watchHealth reads the GPUs' faults every HealthPoll and republishes the slices when a
// GPU's taints must come or go.
func (d *Driver) watchHealth(ctx context.Context) {
	d.republishOnChange(ctx, d.cfg.healthPoll(), "a GPU's health changed", func(ctx context.Context) bool {
		changes := d.health.refresh(ctx)
		d.reportHealth(ctx, changes)
		return len(changes) > 0
	})
}

// republishOnChange runs look every interval and republishes the slices after a look that
// changed what they carry.
func (d *Driver) republishOnChange(ctx context.Context, interval time.Duration, what string, look func(context.Context) bool) {
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		if !look(ctx) {
			continue
		}
		if err := d.publish(ctx); err != nil {
			// The next change publishes again; the helper also retries on its own.
			klog.FromContext(ctx).Error(err, "Publishing the ResourceSlices after "+what)
		}
	}
}

// watchMPS checks fgpu's MPS daemons every HealthPoll, on its own so that a slow daemon
// delays no GPU's taint: a dead one is restarted, and the pods of one whose clients lost
// their server are moved.
func (d *Driver) watchMPS(ctx context.Context) {
	ticker := time.NewTicker(d.cfg.healthPoll())
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		d.moveMPSClients(ctx, d.state.CheckMPS(ctx))
	}
}

// reportHealth tells a person what changed: a log line and a Node event each.
func (d *Driver) reportHealth(ctx context.Context, changes []HealthChange) {
	d.metrics.observeHealth(d.state.Devices(), d.health.taints)
	logger := klog.FromContext(ctx)
	for _, c := range changes {
		logger.Info(c.Message, "device", c.Device, "uuid", c.UUID, "reason", c.Reason)
		if err := nodeEvent(ctx, d.client, d.cfg.NodeName, c.Type, c.Reason, c.Message); err != nil {
			logger.Error(err, "Recording a Node event about a GPU's health", "device", c.Device)
		}
	}
}

// watchForeign polls the GPUs for processes fgpu did not start and republishes the slices
// when a GPU's taint must come or go.
func (d *Driver) watchForeign(ctx context.Context) {
	d.republishOnChange(ctx, d.cfg.foreignPoll(), "foreign processes changed", func(ctx context.Context) bool {
		changes := d.state.RefreshForeign(ctx)
		d.reportForeign(ctx, changes)
		return len(changes) > 0
	})
}

// reportForeign tells a person what changed: a log line and a Node event each.
func (d *Driver) reportForeign(ctx context.Context, changes []ForeignChange) {
	logger := klog.FromContext(ctx)
	for _, c := range changes {
		eventType, reason := corev1.EventTypeWarning, ReasonForeignProcesses
		if len(c.PIDs) == 0 {
			eventType, reason = corev1.EventTypeNormal, ReasonForeignProcessesGone
		}
		logger.Info(c.Message(), "device", c.Device, "uuid", c.UUID)
		logger.V(2).Info("Processes fgpu did not start", "device", c.Device, "pids", c.PIDs)
		if err := nodeEvent(ctx, d.client, d.cfg.NodeName, eventType, reason, c.Message()); err != nil {
			logger.Error(err, "Recording a Node event about foreign processes", "device", c.Device)
		}
	}
}

// Failed is closed when a fatal background error stopped the driver; Err says why.
func (d *Driver) Failed() <-chan struct{} { return d.ctx.Done() }

// Err is the fatal error that stopped the driver, if any.
func (d *Driver) Err() error { return context.Cause(d.ctx) }

// Stop unregisters from the kubelet.
func (d *Driver) Stop() {
	d.helper.Stop()
	d.cancel(errors.New("driver stopped"))
	if d.state.spares.enabled() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(d.ctx), spareStopTimeout)
		defer cancel()
		d.state.spares.stop(ctx)
	}
}

// spareStopTimeout bounds how long a stopping plugin waits for its spares' pods to be
// deleted (within the pod's termination grace period).
const spareStopTimeout = 10 * time.Second

// PrepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	logger := klog.FromContext(ctx)
	result := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		start := time.Now()
		pods, err := d.podsOf(ctx, claim)
		if err != nil {
			d.metrics.observePrepare(time.Since(start), err)
			logger.Error(err, "Prepare failed", "claim", klog.KObj(claim))
			result[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("fgpu: %w", err)}
			continue
		}
		devices, err := d.state.PrepareFor(ctx, claim, pods)
		d.metrics.observePrepare(time.Since(start), err)
		if err != nil {
			logger.Error(err, "Prepare failed", "claim", klog.KObj(claim))
			result[claim.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("fgpu: %w", err)}
			// The allocator places the claim again when told why; without it the pod would
			// stay in ContainerCreating.
			if err := d.publishRefusal(ctx, claim, err); err != nil {
				logger.Error(err, "Recording the refused prepare on the claim", "claim", klog.KObj(claim))
			}
			continue
		}
		result[claim.UID] = kubeletplugin.PrepareResult{Devices: devices}
		if err := d.publishDeviceStatus(ctx, claim); err != nil {
			// The status is for people; the pod must not wait for it.
			logger.Error(err, "Updating claim device status", "claim", klog.KObj(claim))
		}
	}
	d.metrics.observeState(d.state)
	return result, nil
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	result := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		if err := d.state.Unprepare(ctx, string(c.UID)); err != nil {
			result[c.UID] = fmt.Errorf("fgpu: %w", err)
			continue
		}
		result[c.UID] = nil
	}
	d.metrics.observeState(d.state)
	return result, nil
}

// HandleError implements kubeletplugin.DRAPlugin: recoverable errors are logged; others
// stop the plugin so that it restarts cleanly.
func (d *Driver) HandleError(ctx context.Context, err error, msg string) {
	utilruntime.HandleErrorWithContext(ctx, err, msg)
	if !errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.cancel(fmt.Errorf("fatal background error: %s: %w", msg, err))
	}
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: every GPU's health, again at each
// change and every healthResend, so that pods show their devices' health
// (status.containerStatuses[].allocatedResourcesStatus).
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	ticker := time.NewTicker(healthResend)
	defer ticker.Stop()
	for {
		changed := d.health.changes()
		select {
		case <-ctx.Done():
			return nil
		case reports <- d.health.report():
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		case <-ticker.C:
		}
	}
}
