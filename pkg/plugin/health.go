package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// GPU health (docs/faults.md): the backend's faults and those of fgpu's MPS daemons become
// device taints, Node events and the kubelet's device health.

// The taints of a faulty GPU; each value names the reason ("xid-79", "lost", ...).
const (
	// FaultTaintKey (NoExecute) marks a GPU whose work cannot go on.
	FaultTaintKey = "fgpu.dev/gpu-fault"
	// DegradedTaintKey (NoSchedule) marks a GPU whose work may go on but that takes no more.
	DegradedTaintKey = "fgpu.dev/gpu-degraded"
	// FlappingTaintKey (NoSchedule) keeps a GPU that faulted FlapCount times within
	// FlapWindow fenced for FlapBackoff, also after its faults cleared.
	FlappingTaintKey = "fgpu.dev/gpu-flapping"
)

// The Node events' reasons.
const (
	ReasonGPUFault        = "FgpuGPUFault"
	ReasonGPURecovered    = "FgpuGPURecovered"
	ReasonGPUFlapping     = "FgpuGPUFlapping"
	ReasonGPUFaultCleared = "FgpuGPUFaultsCleared"
)

// Health defaults: a fault is published within HealthPoll (plus the API round trip); a GPU
// that faulted DefaultFlapCount times within DefaultFlapWindow stays fenced for
// DefaultFlapBackoff.
const (
	DefaultHealthPoll  = 2 * time.Second
	DefaultFlapCount   = 3
	DefaultFlapWindow  = 10 * time.Minute
	DefaultFlapBackoff = 15 * time.Minute
	// healthResend keeps the kubelet's view fresh: it takes a device's health as unknown
	// 30 s after the last report.
	healthResend = 10 * time.Second
)

// ClearFaultsDir is where an admin asks the plugin to forget a GPU's latched faults and
// back-off: an empty file named after the device ("gpu-0") or "all" (fgpu faults clear).
func ClearFaultsDir(pluginDataDir string) string {
	return filepath.Join(pluginDataDir, "clear-faults")
}

func (c Config) healthPath() string { return filepath.Join(c.PluginDataDir, "health.json") }

// gpuRecord is what a restart must not forget about a GPU: the latched faults (an event
// is not seen twice), the recent fault onsets and the back-off.
type gpuRecord struct {
	Latched     []gpu.Fault `json:"latched,omitempty"`
	Onsets      []time.Time `json:"onsets,omitempty"`
	FencedUntil time.Time   `json:"fencedUntil,omitzero"`
}

// HealthChange is a GPU whose health changed, for the log and a Node event.
type HealthChange struct {
	Device, UUID string
	Reason, Type string
	Message      string
}

// health tracks the GPUs' faults. Its lock is a leaf: it calls no State method under it.
type health struct {
	cfg     Config
	mon     gpu.HealthMonitor // nil: the backend reports no faults
	devices []gpu.Device
	now     func() time.Time

	mu      sync.Mutex
	active  map[string][]gpu.Fault // by UUID
	records map[string]*gpuRecord  // by UUID; persisted
	listErr string
	// changed is closed and replaced when a GPU's health changes.
	changed chan struct{}
}

func newHealth(ctx context.Context, cfg Config, backend gpu.Backend, devices []gpu.Device) *health {
	h := &health{cfg: cfg, devices: devices, now: time.Now,
		active: map[string][]gpu.Fault{}, records: map[string]*gpuRecord{}, changed: make(chan struct{})}
	h.mon, _ = backend.(gpu.HealthMonitor)
	raw, err := os.ReadFile(cfg.healthPath())
	switch {
	case err == nil:
		if err := json.Unmarshal(raw, &h.records); err != nil {
			// Only latched faults and back-offs are lost: the conditions are read again.
			klog.FromContext(ctx).Error(err, "Ignoring an unreadable GPU health record", "path", cfg.healthPath())
			h.records = map[string]*gpuRecord{}
		}
	case !errors.Is(err, os.ErrNotExist):
		klog.FromContext(ctx).Error(err, "Ignoring an unreadable GPU health record", "path", cfg.healthPath())
	}
	// A GPU no longer on the node has nothing to keep.
	maps.DeleteFunc(h.records, func(uuid string, _ *gpuRecord) bool {
		return !slices.ContainsFunc(devices, func(d gpu.Device) bool { return d.UUID == uuid })
	})
	return h
}

// refresh reads the faults again (mps: those of fgpu's MPS daemons, by GPU UUID), takes
// the admin's clear requests, and returns what changed.
func (h *health) refresh(ctx context.Context, mps map[string][]gpu.Fault) []HealthChange {
	logger := klog.FromContext(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	var changes []HealthChange
	dirty := false
	for _, d := range h.clearRequests(ctx) {
		if h.mon != nil {
			if err := h.mon.ClearFaults(d.UUID); err != nil {
				logger.Error(err, "Clearing a GPU's latched faults", "device", d.Name())
			}
		}
		delete(h.records, d.UUID)
		dirty = true
		changes = append(changes, HealthChange{Device: d.Name(), UUID: d.UUID, Type: corev1.EventTypeNormal, Reason: ReasonGPUFaultCleared,
			Message: fmt.Sprintf("GPU %s (%s): an admin cleared its latched faults and back-off; conditions that still hold are reported again", d.Name(), d.UUID)})
	}
	var found map[string][]gpu.Fault
	if h.mon != nil {
		var err error
		found, err = h.mon.Faults()
		switch {
		case err != nil && h.listErr != err.Error():
			logger.Error(err, "Reading the GPUs' faults; a GPU whose faults cannot be read keeps its last verdict")
			h.listErr = err.Error()
		case err == nil && h.listErr != "":
			logger.Info("Reading the GPUs' faults works again")
			h.listErr = ""
		}
		if err != nil && len(found) == 0 {
			found = maps.Clone(h.active)
		}
	}
	for _, d := range h.devices {
		rec := h.records[d.UUID]
		if rec == nil {
			rec = &gpuRecord{}
		}
		var now2 []gpu.Fault
		for _, f := range append(slices.Clone(found[d.UUID]), mps[d.UUID]...) {
			if f.Kind == gpu.FaultXID && gpu.ApplicationXID(f.XID) {
				continue
			}
			now2 = addFault(now2, f)
			if f.Latched && !slices.ContainsFunc(rec.Latched, sameFault(f)) {
				rec.Latched = append(rec.Latched, f)
				dirty = true
			}
		}
		for _, f := range rec.Latched {
			now2 = addFault(now2, f)
		}
		before := h.active[d.UUID]
		for i, f := range now2 {
			if j := slices.IndexFunc(before, sameFault(f)); j >= 0 {
				now2[i].Since = before[j].Since
			}
		}
		wasFenced := !rec.FencedUntil.IsZero()
		if wasFenced && !now.Before(rec.FencedUntil) {
			rec.FencedUntil = time.Time{}
			dirty = true
			changes = append(changes, HealthChange{Device: d.Name(), UUID: d.UUID, Type: corev1.EventTypeNormal, Reason: ReasonGPURecovered,
				Message: fmt.Sprintf("GPU %s (%s): its back-off after repeated faults is over; it is offered again unless a fault still holds", d.Name(), d.UUID)})
		}
		if len(before) == 0 && len(now2) > 0 {
			rec.Onsets = append(slices.DeleteFunc(rec.Onsets, func(t time.Time) bool { return now.Sub(t) > h.cfg.flapWindow() }), now)
			dirty = true
			if len(rec.Onsets) >= h.cfg.flapCount() && rec.FencedUntil.IsZero() {
				rec.FencedUntil = now.Add(h.cfg.flapBackoff())
				changes = append(changes, HealthChange{Device: d.Name(), UUID: d.UUID, Type: corev1.EventTypeWarning, Reason: ReasonGPUFlapping,
					Message: fmt.Sprintf("GPU %s (%s) faulted %d times within %s; it stays fenced (%s:NoSchedule) until %s, also once its faults clear",
						d.Name(), d.UUID, len(rec.Onsets), h.cfg.flapWindow(), FlappingTaintKey, rec.FencedUntil.UTC().Format(time.RFC3339))})
			}
		}
		if reasons(before) != reasons(now2) {
			changes = append(changes, faultChange(d, before, now2))
		}
		if len(now2) == 0 {
			delete(h.active, d.UUID)
		} else {
			h.active[d.UUID] = now2
		}
		if rec.FencedUntil.IsZero() && len(rec.Latched) == 0 && len(rec.Onsets) == 0 {
			delete(h.records, d.UUID)
		} else {
			h.records[d.UUID] = rec
		}
	}
	if dirty {
		if err := h.save(); err != nil {
			logger.Error(err, "Recording the GPUs' health; a restart may forget latched faults and back-offs")
		}
	}
	if len(changes) > 0 {
		close(h.changed)
		h.changed = make(chan struct{})
	}
	return changes
}

func faultChange(d gpu.Device, before, now []gpu.Fault) HealthChange {
	c := HealthChange{Device: d.Name(), UUID: d.UUID}
	if len(now) == 0 {
		c.Type, c.Reason = corev1.EventTypeNormal, ReasonGPURecovered
		c.Message = fmt.Sprintf("GPU %s (%s) recovered from %s; its fault taints are removed", d.Name(), d.UUID, reasons(before))
		return c
	}
	c.Type, c.Reason = corev1.EventTypeWarning, ReasonGPUFault
	var effects []string
	for _, t := range faultTaints(now, time.Time{}, time.Time{}) {
		effects = append(effects, fmt.Sprintf("%s=%s:%s", t.Key, t.Value, t.Effect))
	}
	c.Message = fmt.Sprintf("GPU %s (%s) has %s: tainted %s", d.Name(), d.UUID, describe(now), strings.Join(effects, ", "))
	if worst(now) == gpu.SeverityFatal {
		c.Message += "; pods using it are evicted"
	} else {
		c.Message += "; running pods stay, no new claim is placed on it"
	}
	return c
}

// taints are the device's fault taints (nil: none).
func (h *health) taints(uuid string) []resourceapi.DeviceTaint {
	h.mu.Lock()
	defer h.mu.Unlock()
	var until time.Time
	if rec := h.records[uuid]; rec != nil {
		until = rec.FencedUntil
	}
	return faultTaints(h.active[uuid], until, h.now())
}

// faultTaints: one NoExecute taint for the first fatal fault, one NoSchedule taint for the
// first degraded one, and the flapping taint while a back-off lasts. A taint's time is its
// fault's first sighting, so a republish does not change it.
func faultTaints(faults []gpu.Fault, fencedUntil, now time.Time) []resourceapi.DeviceTaint {
	var out []resourceapi.DeviceTaint
	add := func(key string, effect resourceapi.DeviceTaintEffect, sev gpu.Severity) {
		for _, f := range faults {
			if f.Severity() == sev {
				out = append(out, resourceapi.DeviceTaint{Key: key, Value: f.Reason(), Effect: effect, TimeAdded: taintTime(f.Since)})
				return
			}
		}
	}
	add(FaultTaintKey, resourceapi.DeviceTaintEffectNoExecute, gpu.SeverityFatal)
	add(DegradedTaintKey, resourceapi.DeviceTaintEffectNoSchedule, gpu.SeverityDegraded)
	if now.Before(fencedUntil) {
		out = append(out, resourceapi.DeviceTaint{Key: FlappingTaintKey, Value: "backoff", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	}
	return out
}

func taintTime(t time.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &metav1.Time{Time: t.Truncate(time.Second)}
}

// report is the kubelet's view: a GPU with a fault is Unhealthy, its faults the message.
func (h *health) report() kubeletplugin.DeviceHealthReport {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	var r kubeletplugin.DeviceHealthReport
	for _, d := range h.devices {
		dh := kubeletplugin.DeviceHealth{PoolName: h.cfg.NodeName, DeviceName: d.Name(), Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now}
		if fs := h.active[d.UUID]; len(fs) > 0 {
			dh.Health = kubeletplugin.HealthStatusUnhealthy
			dh.Message = fmt.Sprintf("%s: %s", worst(fs), describe(fs))
		} else if rec := h.records[d.UUID]; rec != nil && now.Before(rec.FencedUntil) {
			dh.Message = "fenced after repeated faults until " + rec.FencedUntil.UTC().Format(time.RFC3339)
		}
		r.Devices = append(r.Devices, dh)
	}
	return r
}

// changes returns a channel closed at the next change.
func (h *health) changes() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.changed
}

// clearRequests takes the admin's clear files. Caller holds h.mu.
func (h *health) clearRequests(ctx context.Context) []gpu.Device {
	dir := ClearFaultsDir(h.cfg.PluginDataDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			klog.FromContext(ctx).Error(err, "Reading the requests to clear GPU faults", "dir", dir)
		}
		return nil
	}
	var out []gpu.Device
	for _, e := range entries {
		name := e.Name()
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			klog.FromContext(ctx).Error(err, "Removing a request to clear GPU faults", "request", name)
		}
		matched := false
		for _, d := range h.devices {
			if name == "all" || name == d.Name() || name == d.UUID {
				out = append(out, d)
				matched = true
			}
		}
		if !matched {
			klog.FromContext(ctx).Error(nil, "A request to clear GPU faults names no GPU of this node", "request", name)
		}
	}
	return out
}

// save writes the records, replacing the file whole. Caller holds h.mu.
func (h *health) save() error {
	raw, err := json.Marshal(h.records)
	if err != nil {
		return err
	}
	tmp := h.cfg.healthPath() + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, h.cfg.healthPath())
}

func sameFault(f gpu.Fault) func(gpu.Fault) bool {
	return func(o gpu.Fault) bool { return o.Reason() == f.Reason() }
}

func addFault(fs []gpu.Fault, f gpu.Fault) []gpu.Fault {
	if slices.ContainsFunc(fs, sameFault(f)) {
		return fs
	}
	return append(fs, f)
}

func reasons(fs []gpu.Fault) string {
	var r []string
	for _, f := range fs {
		r = append(r, f.Reason())
	}
	slices.Sort(r)
	return strings.Join(r, ", ")
}

func describe(fs []gpu.Fault) string {
	var r []string
	for _, f := range fs {
		r = append(r, f.String())
	}
	return strings.Join(r, ", ")
}

func worst(fs []gpu.Fault) gpu.Severity {
	var w gpu.Severity
	for _, f := range fs {
		w = max(w, f.Severity())
	}
	return w
}
