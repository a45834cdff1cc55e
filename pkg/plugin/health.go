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

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// GPU health (docs/faults.md): the backend's faults become device taints, Node events and
// the kubelet's device health (the taints: configapi.FaultTaintKey, DegradedTaintKey and
// FlappingTaintKey). fgpu's MPS daemons are not the GPU's health: each serves one
// isolation domain (mpshealth.go).

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
	// SlowdownPolls damps thermal and power slowdowns, which come and go with the load: one
	// is reported after that many polls in a row see it, and lifted after as many do not.
	SlowdownPolls = 3
)

// ClearFaultsDir is where an admin asks the plugin to forget a GPU's latched faults and
// back-off: an empty file named after the device ("gpu-0") or "all" (fgpu faults clear).
func ClearFaultsDir(pluginDataDir string) string {
	return filepath.Join(pluginDataDir, "clear-faults")
}

func (c Config) healthPath() string { return filepath.Join(c.PluginDataDir, "health.json") }

// gpuRecord is what a restart must not forget about a GPU: the latched faults (an event
// is not seen twice), the recent fault onsets, the back-off, and the faults it has now with
// their first sighting (a restart during a fault is no new onset, and keeps the taints' time).
type gpuRecord struct {
	Active      []gpu.Fault `json:"active,omitempty"`
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
	// readErrs is the last error reading each GPU's faults (by UUID; "" for none in
	// particular), logged once.
	readErrs map[string]string
	// streaks counts the polls in a row whose reading of a slowdown ("<uuid>/<reason>")
	// differs from its verdict (SlowdownPolls).
	streaks map[string]int
	// refreshed is false until the first refresh: at a start the conditions are read
	// afresh, and a restored one that went while the plugin was down goes at once.
	refreshed bool
	// changed is closed and replaced when a GPU's health changes.
	changed chan struct{}
}

func newHealth(ctx context.Context, cfg Config, backend gpu.Backend, devices []gpu.Device) *health {
	h := &health{cfg: cfg, devices: devices, now: time.Now,
		active: map[string][]gpu.Fault{}, records: map[string]*gpuRecord{}, readErrs: map[string]string{}, streaks: map[string]int{},
		changed: make(chan struct{})}
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
	for uuid, rec := range h.records {
		// An earlier version latched XIDs that are one context's.
		rec.Latched = slices.DeleteFunc(rec.Latched, notTheGPUs)
		rec.Active = slices.DeleteFunc(rec.Active, notTheGPUs)
		if len(rec.Active) > 0 {
			h.active[uuid] = rec.Active
		}
	}
	return h
}

// refresh reads the faults again, takes the admin's clear requests, and returns what
// changed.
func (h *health) refresh(ctx context.Context) []HealthChange {
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
	var errs map[string]error
	if h.mon != nil {
		found, errs = h.mon.Faults()
	}
	h.logReadErrors(ctx, errs)
	for _, d := range h.devices {
		rec := h.records[d.UUID]
		if rec == nil {
			rec = &gpuRecord{}
		}
		before := h.active[d.UUID]
		var now2 []gpu.Fault
		for _, f := range found[d.UUID] {
			switch {
			case notTheGPUs(f):
				// One context's fault (its recovery action is none): under MPS its server's
				// FAULT moves that isolation domain (mpshealth.go); the GPU is everyone's.
			case f.Latched:
				if !slices.ContainsFunc(rec.Latched, sameFault(f)) {
					rec.Latched = append(rec.Latched, f)
					dirty = true
				}
			default:
				now2 = addFault(now2, f)
			}
		}
		if errs[d.UUID] != nil {
			// Unreadable: its conditions keep their last verdict. Latched faults come from the
			// record only, so an admin's clear holds.
			now2 = slices.DeleteFunc(slices.Clone(before), func(f gpu.Fault) bool { return f.Latched })
		} else {
			now2 = h.damp(d.UUID, before, now2)
		}
		for _, f := range rec.Latched {
			now2 = addFault(now2, f)
		}
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
						d.Name(), d.UUID, len(rec.Onsets), h.cfg.flapWindow(), configapi.FlappingTaintKey, rec.FencedUntil.UTC().Format(time.RFC3339))})
			}
		}
		if reasons(before) != reasons(now2) {
			changes = append(changes, faultChange(d, before, now2))
			rec.Active = now2
			dirty = true
		}
		if len(now2) == 0 {
			delete(h.active, d.UUID)
		} else {
			h.active[d.UUID] = now2
		}
		if rec.FencedUntil.IsZero() && len(rec.Latched) == 0 && len(rec.Onsets) == 0 && len(rec.Active) == 0 {
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
	h.refreshed = true
	return changes
}

// damp holds a thermal or power slowdown's verdict (before) until SlowdownPolls readings in
// a row (read) disagree with it; other conditions are taken as read. Caller holds h.mu.
func (h *health) damp(uuid string, before, read []gpu.Fault) []gpu.Fault {
	damped := func(f gpu.Fault) bool { return f.Kind == gpu.FaultThermal || f.Kind == gpu.FaultPower }
	out := slices.DeleteFunc(slices.Clone(read), damped)
	for _, kind := range []gpu.FaultKind{gpu.FaultThermal, gpu.FaultPower} {
		key := uuid + "/" + string(kind)
		is := func(f gpu.Fault) bool { return f.Kind == kind }
		i, j := slices.IndexFunc(before, is), slices.IndexFunc(read, is)
		switch {
		case (i >= 0) == (j >= 0):
			delete(h.streaks, key)
			if j >= 0 {
				out = append(out, read[j])
			}
		case i >= 0 && !h.refreshed:
			// Restored at a start, and gone while the plugin was down.
			delete(h.streaks, key)
		default:
			h.streaks[key]++
			if h.streaks[key] >= SlowdownPolls {
				delete(h.streaks, key)
				if j >= 0 {
					out = append(out, read[j])
				}
			} else if i >= 0 {
				out = append(out, before[i])
			}
		}
	}
	return out
}

// logReadErrors logs each GPU's error reading its faults once, and when it went. Caller
// holds h.mu.
func (h *health) logReadErrors(ctx context.Context, errs map[string]error) {
	logger := klog.FromContext(ctx)
	for uuid, err := range errs {
		if err == nil || h.readErrs[uuid] == err.Error() {
			continue
		}
		h.readErrs[uuid] = err.Error()
		if uuid == "" {
			logger.Error(err, "Reading the GPUs' faults")
		} else {
			logger.Error(err, "Reading a GPU's faults; it keeps its last verdict until they can be read", "gpu", uuid)
		}
	}
	for uuid := range h.readErrs {
		if errs[uuid] == nil {
			delete(h.readErrs, uuid)
			logger.Info("Reading the GPU's faults works again", "gpu", uuid)
		}
	}
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
	add(configapi.FaultTaintKey, resourceapi.DeviceTaintEffectNoExecute, gpu.SeverityFatal)
	add(configapi.DegradedTaintKey, resourceapi.DeviceTaintEffectNoSchedule, gpu.SeverityDegraded)
	if now.Before(fencedUntil) {
		out = append(out, resourceapi.DeviceTaint{Key: configapi.FlappingTaintKey, Value: "backoff", Effect: resourceapi.DeviceTaintEffectNoSchedule})
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

// save writes the records with write-fsync-rename, so that a crash leaves the old or the
// new file, never a torn one. Caller holds h.mu.
func (h *health) save() error {
	raw, err := json.Marshal(h.records)
	if err != nil {
		return err
	}
	path := h.cfg.healthPath()
	tmp, err := os.CreateTemp(filepath.Dir(path), ".health-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(raw)
	if err == nil {
		err = tmp.Sync()
	}
	if err := errors.Join(err, tmp.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

func notTheGPUs(f gpu.Fault) bool { return f.Severity() == gpu.SeverityNone }

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
