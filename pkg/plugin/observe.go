package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// Observe mode: the "before" of an adoption. On a node where other software owns GPUs
// (NVIDIA's device plugin, a host job), the plugin measures what each pod fgpu did not place
// uses of each GPU, without touching the GPUs, so that the allocator can size shares for
// those pods before they move to fgpu. The usage meter reads the GPUs (usageMeter.sample) and
// hands over the processes no prepared share accounts for; fgpu's MPS servers are left out
// (foreignWatch.ownServerPIDs), and so are processes in no pod's cgroup (host jobs): with no
// pod there is nothing to size. The whole node's use goes, as configapi.ObservedUsage, into
// the ConfigMap ObservedUsagePrefix+<node> of the plugin's namespace.

// A window bounded while writes fail: past maxWindowSamples samples of one pod on one GPU (or
// of one claim's share, usage.go), all but the newest half are folded into its summary
// (sizing.Window.Bound), which keeps their count, mean and peak exactly and their 95th
// percentile close (never below). At a poll every
// few seconds, a report interval's samples are far fewer.
const maxWindowSamples = 1024

// maxObservedBytes bounds the JSON written into the ConfigMap: an object's data may hold
// 1 MiB, and its metadata goes beside it.
const maxObservedBytes = 1<<20 - 16<<10

// observedKey is one pod's use of one GPU.
type observedKey struct{ podUID, uuid string }

type observedUse struct {
	window sizing.Window
	// lastSeen is when the pod last had a process on the GPU: one gone a whole report
	// interval is dropped.
	lastSeen time.Time
}

// observer keeps the windows of observe mode and writes them to the node's ConfigMap once
// per report interval, when they moved beyond the thresholds (sizing.Differs), the pods
// changed, or the heartbeat passed. Only watchUsage's loop uses it.
type observer struct {
	client          kubernetes.Interface
	node, namespace string
	devices         map[string]string // device name by GPU UUID
	report          time.Duration
	heartbeat       time.Duration
	// pods is the node's pod watch (set by watchPods before the loop starts): it names the
	// pods by UID.
	pods corelisters.PodLister

	uses map[observedKey]*observedUse
	// published is what the last write carried (nil before the first of this run), at
	// publishedAt (or, before any, the first sample's time, so that the first report waits
	// an interval). exists: the ConfigMap is there (written, or found by the first write).
	published   map[observedKey]configapi.ShareUsage
	publishedAt time.Time
	exists      bool
}

func newObserver(client kubernetes.Interface, node, namespace string, devs []gpu.Device, report, heartbeat time.Duration) *observer {
	o := &observer{client: client, node: node, namespace: namespace, devices: map[string]string{},
		report: report, heartbeat: heartbeat, uses: map[observedKey]*observedUse{}}
	for _, d := range devs {
		o.devices[d.UUID] = d.Name()
	}
	return o
}

// gpus are the GPUs to read: all of the node's.
func (o *observer) gpus() []string { return slices.Sorted(maps.Keys(o.devices)) }

// sample adds one poll's processes (usageMeter.sample's unclaimed ones) to the pods' windows.
// servers lists fgpu's MPS servers; it asks the daemons, so only when a pod's process is there.
func (o *observer) sample(now time.Time, procs []unclaimedProcess, servers func() []int) {
	if o.publishedAt.IsZero() {
		o.publishedAt = now
	}
	var own []int
	if slices.ContainsFunc(procs, func(p unclaimedProcess) bool { return p.PodUID != "" }) {
		own = servers()
	}
	use := map[observedKey]sizing.Sample{}
	for _, p := range procs {
		if p.PodUID == "" || slices.Contains(own, p.PID) {
			continue // a host job (no pod, nothing to size), or fgpu's MPS server
		}
		k := observedKey{p.PodUID, p.UUID}
		u, counted := use[k]
		use[k] = addUse(u, counted, p.ProcessUsage)
	}
	for k, u := range o.uses {
		if _, ok := use[k]; !ok {
			if now.Sub(u.lastSeen) >= o.report {
				delete(o.uses, k)
				continue
			}
			// As with a claim: once seen, a poll without its processes is a sample of zero.
			u.window.Add(sizing.Sample{At: now})
		}
	}
	for k, s := range use {
		u := o.uses[k]
		if u == nil {
			u = &observedUse{}
			o.uses[k] = u
		}
		s.At = now
		u.window.Add(s)
		u.lastSeen = now
	}
	for _, u := range o.uses {
		u.window.Bound(maxWindowSamples)
	}
}

// publishIfDue writes the node's observed use when its report is due. Nothing is written
// while nothing was observed and no ConfigMap exists; once one does, it is kept true: pods
// gone leave an empty list, not stale entries.
func (o *observer) publishIfDue(ctx context.Context, now time.Time) error {
	if o.publishedAt.IsZero() || now.Sub(o.publishedAt) < o.report {
		return nil
	}
	sums := map[observedKey]configapi.ShareUsage{}
	for k, u := range o.uses {
		if sum, ok := u.window.Summary(); ok {
			sums[k] = sum
		}
	}
	if o.published != nil && !o.changed(sums) && (now.Sub(o.publishedAt) < o.heartbeat || !o.exists) {
		return nil
	}
	usage, written := o.usage(sums)
	if dropped := fitObserved(&usage, written, maxObservedBytes); len(dropped) > 0 {
		// Their windows are kept (folded), for a write with room.
		klog.FromContext(ctx).Info("Leaving the smallest uses out of the node's observed-usage ConfigMap, which would pass its size limit",
			"configMap", klog.KRef(o.namespace, configapi.ObservedUsagePrefix+o.node), "left", len(dropped), "limitBytes", maxObservedBytes)
	}
	if len(usage.Pods) == 0 && o.published != nil && !o.exists {
		return nil
	}
	if err := o.write(ctx, usage); err != nil {
		// Tried again after an interval, with the samples kept, not at every poll.
		o.publishedAt = now
		return err
	}
	o.published, o.publishedAt = written, now
	for k := range written {
		o.uses[k].window.Reset()
	}
	return nil
}

// changed says whether sums would be written differently from the last write.
func (o *observer) changed(sums map[observedKey]configapi.ShareUsage) bool {
	if len(sums) != len(o.published) {
		return true
	}
	for k, sum := range sums {
		prev, ok := o.published[k]
		if !ok || sizing.Differs(sum, prev) {
			return true
		}
	}
	return false
}

// usage is what to write, and which of sums it carries: a pod the pod watch does not know
// (gone, or not seen yet) is left out.
func (o *observer) usage(sums map[observedKey]configapi.ShareUsage) (configapi.ObservedUsage, map[observedKey]configapi.ShareUsage) {
	usage := configapi.ObservedUsage{Node: o.node, Pods: []configapi.ObservedPod{}}
	written := map[observedKey]configapi.ShareUsage{}
	if len(sums) == 0 || o.pods == nil {
		return usage, written
	}
	all, err := o.pods.List(labels.Everything())
	if err != nil { // a cache's List does not fail; nothing is known then
		return usage, written
	}
	byUID := map[string]*corev1.Pod{}
	for _, p := range all {
		byUID[string(p.UID)] = p
	}
	entries := map[string]*configapi.ObservedPod{}
	for k, sum := range sums {
		pod := byUID[k.podUID]
		// fgpu's own pods (an MPS server whose PID the daemons did not give on this poll)
		// are never a workload fgpu did not place.
		if pod == nil || pod.Namespace == o.namespace {
			continue
		}
		e := entries[k.podUID]
		if e == nil {
			e = &configapi.ObservedPod{Namespace: pod.Namespace, Name: pod.Name, UID: k.podUID}
			entries[k.podUID] = e
		}
		e.GPUs = append(e.GPUs, configapi.ObservedGPU{UUID: k.uuid, Device: o.devices[k.uuid], Usage: sum})
		written[k] = sum
	}
	for _, e := range entries {
		slices.SortFunc(e.GPUs, func(a, b configapi.ObservedGPU) int { return cmp.Compare(a.UUID, b.UUID) })
		usage.Pods = append(usage.Pods, *e)
	}
	slices.SortFunc(usage.Pods, func(a, b configapi.ObservedPod) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.UID, b.UID))
	})
	return usage, written
}

// fitObserved leaves out of usage what would take its JSON past limit bytes: first the pods'
// uses of a GPU that ended longest ago, then the smallest (by peak memory), a pod with no
// GPU left with them. It drops them from written too, and returns them.
func fitObserved(usage *configapi.ObservedUsage, written map[observedKey]configapi.ShareUsage, limit int) []observedKey {
	var dropped []observedKey
	for {
		raw, err := json.Marshal(usage)
		if err != nil || len(raw) <= limit {
			return dropped
		}
		type entry struct {
			key  observedKey
			size int
			use  configapi.ShareUsage
		}
		// By namespace, so that the namespace with the most entries loses its own first: one
		// tenant churning pods on the node cannot push another's small uses out.
		byNS := map[string][]entry{}
		for _, p := range usage.Pods {
			for _, g := range p.GPUs {
				one, _ := json.Marshal(g)
				byNS[p.Namespace] = append(byNS[p.Namespace], entry{observedKey{p.UID, g.UUID}, len(one) + 1, g.Usage})
			}
		}
		for _, entries := range byNS {
			slices.SortFunc(entries, func(a, b entry) int {
				return cmp.Or(a.use.To.Compare(b.use.To), cmp.Compare(a.use.MemoryMaxBytes, b.use.MemoryMaxBytes),
					cmp.Compare(a.key.podUID, b.key.podUID), cmp.Compare(a.key.uuid, b.key.uuid))
			})
		}
		drop := map[observedKey]bool{}
		for excess := len(raw) - limit; excess > 0 && len(byNS) > 0; {
			most := ""
			for ns, entries := range byNS {
				if most == "" || len(entries) > len(byNS[most]) || len(entries) == len(byNS[most]) && ns < most {
					most = ns
				}
			}
			e := byNS[most][0]
			if byNS[most] = byNS[most][1:]; len(byNS[most]) == 0 {
				delete(byNS, most)
			}
			drop[e.key] = true
			excess -= e.size
		}
		pods := usage.Pods[:0]
		for _, p := range usage.Pods {
			p.GPUs = slices.DeleteFunc(p.GPUs, func(g configapi.ObservedGPU) bool { return drop[observedKey{p.UID, g.UUID}] })
			if len(p.GPUs) > 0 {
				pods = append(pods, p)
			}
		}
		usage.Pods = pods
		for k := range drop {
			delete(written, k)
			dropped = append(dropped, k)
		}
	}
}

// write creates or replaces the node's ConfigMap; an empty list creates none.
func (o *observer) write(ctx context.Context, usage configapi.ObservedUsage) error {
	raw, err := json.Marshal(usage)
	if err != nil {
		return err
	}
	name := configapi.ObservedUsagePrefix + o.node
	cms := o.client.CoreV1().ConfigMaps(o.namespace)
	cm, err := cms.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		o.exists = false
		if len(usage.Pods) == 0 {
			return nil
		}
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: o.namespace}}
		o.label(cm)
		cm.Data = map[string]string{configapi.ObservedUsageKey: string(raw)}
		if _, err := cms.Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ConfigMap %s/%s: %w", o.namespace, name, err)
		}
	case err != nil:
		return fmt.Errorf("read ConfigMap %s/%s: %w", o.namespace, name, err)
	default:
		o.label(cm)
		cm.Data = map[string]string{configapi.ObservedUsageKey: string(raw)}
		if _, err := cms.Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("update ConfigMap %s/%s: %w", o.namespace, name, err)
		}
	}
	o.exists = true
	return nil
}

// label marks the ConfigMap with its node, for listing them all. A node name longer than a
// label value may be (63) goes without: the ConfigMap's name still says it.
func (o *observer) label(cm *corev1.ConfigMap) {
	if len(o.node) > 63 {
		return
	}
	if cm.Labels == nil {
		cm.Labels = map[string]string{}
	}
	cm.Labels[configapi.LabelObservedUsage] = o.node
}
