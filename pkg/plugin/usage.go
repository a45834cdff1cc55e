package plugin

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// Defaults of the usage measurement. A report costs one GET and one status update of the
// claim; see docs/design.md ("Measured usage") for what that comes to at 10,000 claims.
const (
	DefaultUsagePoll      = 10 * time.Second
	DefaultUsageReport    = 5 * time.Minute
	DefaultUsageHeartbeat = 30 * time.Minute
)

// shareKey names one prepared share: a claim's device for one of its requests.
type shareKey struct{ claimUID, request, device string }

type shareUsage struct {
	window sizing.Window
	// seen: a process of the share was on the GPU once; only from then on does an empty
	// GPU count as a sample of zero (before, the pod has not started its work).
	seen bool
	// published is the last summary written to the claim's status, at publishedAt (or,
	// before any, the first sample's time, so that the first report waits an interval).
	published   *configapi.ShareUsage
	publishedAt time.Time
	// latest is the newest sample, for the metrics.
	latest sizing.Sample
}

// usageMeter samples what each prepared share uses and says when its summary is worth an
// API write: at most once per report interval, and only when it moved beyond the
// thresholds (sizing.Differs) or the heartbeat passed.
type usageMeter struct {
	source    gpu.UsageSource
	procRoot  string
	report    time.Duration
	heartbeat time.Duration

	mu     sync.Mutex
	shares map[shareKey]*shareUsage
}

func newUsageMeter(source gpu.UsageSource, procRoot string, report, heartbeat time.Duration) *usageMeter {
	return &usageMeter{source: source, procRoot: procRoot, report: report, heartbeat: heartbeat, shares: map[shareKey]*shareUsage{}}
}

// preparedShare is one share of a prepared claim, as the meter attributes processes to it.
type preparedShare struct {
	key     shareKey
	entry   checkpoint.ClaimEntry
	shareID string
}

// unclaimedProcess is a process no prepared share accounts for, on the GPU UUID: fgpu's MPS
// server, or a process of someone else's (observe mode). PodUID is the pod of its cgroup
// (owner), "" for none.
type unclaimedProcess struct {
	UUID, PodUID string
	gpu.ProcessUsage
}

// sample takes one measurement of every GPU with prepared shares, and of the GPUs others
// (observe mode: every GPU of the node, read here so that each is read once a poll, since a
// reading consumes NVML's SM samples). It returns the claims whose report is due, and the
// processes no share accounts for whose pod, if any, is no prepared claim's: a pod fgpu placed
// is measured through its claims only.
func (m *usageMeter) sample(ctx context.Context, now time.Time, claims map[string]checkpoint.ClaimEntry, others []string) (due []string, unclaimed []unclaimedProcess) {
	byGPU := map[string][]preparedShare{}
	tenants := map[string]bool{}
	for uid, e := range claims {
		if e.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, d := range e.Devices {
			byGPU[d.GPUUUID] = append(byGPU[d.GPUUUID], preparedShare{shareKey{uid, d.Request, d.Device}, e, d.ShareID})
		}
		for _, p := range e.Pods {
			tenants[p.UID] = true
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for k := range m.shares {
		if _, ok := claims[k.claimUID]; !ok {
			delete(m.shares, k)
		}
	}
	uuids := slices.AppendSeq(slices.Clone(others), maps.Keys(byGPU))
	slices.Sort(uuids)
	for _, uuid := range slices.Compact(uuids) {
		shares := byGPU[uuid]
		// A claim's choice among several on one GPU must not depend on map order.
		slices.SortFunc(shares, func(a, b preparedShare) int {
			return strings.Compare(a.entry.Namespace+"/"+a.entry.Name+"/"+a.key.request, b.entry.Namespace+"/"+b.entry.Name+"/"+b.key.request)
		})
		procs, err := m.source.ProcessUsage(uuid)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Measuring the GPU use of prepared claims", "uuid", uuid)
			continue
		}
		use := map[shareKey]sizing.Sample{}
		for _, p := range procs {
			podUID, shareID := m.owner(p.PID)
			var candidates []preparedShare
			for _, s := range shares {
				if podUID != "" && slices.ContainsFunc(s.entry.Pods, func(r checkpoint.PodRef) bool { return r.UID == podUID }) ||
					podUID == "" && shareID != "" && s.shareID == shareID {
					candidates = append(candidates, s)
				}
			}
			if len(candidates) == 0 {
				// fgpu's MPS server, or a process no prepared share accounts for
				if !tenants[podUID] {
					unclaimed = append(unclaimed, unclaimedProcess{UUID: uuid, PodUID: podUID, ProcessUsage: p})
				}
				continue
			}
			pick := candidates[0]
			// Several claims of one pod on this GPU: the share the process was given names it.
			if i := slices.IndexFunc(candidates, func(s preparedShare) bool { return shareID != "" && s.shareID == shareID }); i >= 0 {
				pick = candidates[i]
			}
			u, counted := use[pick.key]
			use[pick.key] = addUse(u, counted, p)
		}
		for _, s := range shares {
			u := m.shares[s.key]
			if u == nil {
				u = &shareUsage{}
				m.shares[s.key] = u
			}
			got, measured := use[s.key]
			if measured {
				u.seen = true
			}
			if !u.seen {
				continue
			}
			if !measured {
				got.SMPercent = 0 // its processes are gone: nothing used
			}
			if u.window.Len() == 0 && u.published == nil {
				u.publishedAt = now
			}
			u.latest = sizing.Sample{At: now, MemoryBytes: got.MemoryBytes, SMPercent: got.SMPercent}
			u.window.Add(u.latest)
			// Bounded while the claim's status writes fail, as observe mode's windows are.
			u.window.Bound(maxWindowSamples)
		}
	}
	for k, u := range m.shares {
		if m.due(u, now) && !slices.Contains(due, k.claimUID) {
			due = append(due, k.claimUID)
		}
	}
	slices.Sort(due)
	return due, unclaimed
}

// addUse adds a process's use to that of its owner's other processes on the GPU (counted:
// there were some): memory adds up, and so does SM (at most 100), which stays -1 (no sample)
// only while none of them has one.
func addUse(u sizing.Sample, counted bool, p gpu.ProcessUsage) sizing.Sample {
	u.MemoryBytes += p.MemoryBytes
	if p.SMPercent >= 0 {
		u.SMPercent = min(100, max(u.SMPercent, 0)+p.SMPercent)
	} else if !counted {
		u.SMPercent = -1
	}
	return u
}

func (m *usageMeter) due(u *shareUsage, now time.Time) bool {
	sum, ok := u.window.Summary()
	if !ok || now.Sub(u.publishedAt) < m.report {
		return false
	}
	return u.published == nil || sizing.Differs(sum, *u.published) || now.Sub(u.publishedAt) >= m.heartbeat
}

// summaries returns what to publish for a claim: each share's newest summary where its report
// is due, and the last one published otherwise (so a status write never drops one).
func (m *usageMeter) summaries(claimUID string, now time.Time) map[shareKey]configapi.ShareUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[shareKey]configapi.ShareUsage{}
	for k, u := range m.shares {
		if k.claimUID != claimUID {
			continue
		}
		if m.due(u, now) {
			sum, _ := u.window.Summary()
			out[k] = sum
		} else if u.published != nil {
			out[k] = *u.published
		}
	}
	return out
}

// latest returns each measured share's newest sample.
func (m *usageMeter) latest() map[shareKey]sizing.Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[shareKey]sizing.Sample{}
	for k, u := range m.shares {
		if u.seen {
			out[k] = u.latest
		}
	}
	return out
}

// lastPublished returns the summaries last written for a claim's shares.
func (m *usageMeter) lastPublished(claimUID string) map[shareKey]configapi.ShareUsage {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[shareKey]configapi.ShareUsage{}
	for k, u := range m.shares {
		if k.claimUID == claimUID && u.published != nil {
			out[k] = *u.published
		}
	}
	return out
}

// published records that the summaries were written to the claim's status: their samples
// are done with.
func (m *usageMeter) published(sums map[shareKey]configapi.ShareUsage, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, sum := range sums {
		u := m.shares[k]
		if u == nil || u.published != nil && *u.published == sum {
			continue
		}
		u.published = &sum
		u.publishedAt = now
		u.window.Reset()
	}
}

// podUIDRE finds a pod's UID in a cgroup path, in both the cgroupfs form
// (/kubepods/burstable/pod<uid>/<container>) and the systemd one (kubepods-burstable-pod<uid
// with underscores>.slice).
var podUIDRE = regexp.MustCompile(`pod([0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12})`)

// owner says which pod a process belongs to, from its cgroup, and the share ID its
// environment names. The pod is the first one in the cgroup path: the kubelet makes that
// cgroup, while a tenant allowed to write its own cgroups could nest one named after another
// pod below it. The share ID is the tenant's to write, so it only ever picks among the
// shares of the process's own pod, or among the node's shares for a process in no pod's
// cgroup (which no tenant can start).
func (m *usageMeter) owner(pid int) (podUID, shareID string) {
	dir := filepath.Join(m.procRoot, strconv.Itoa(pid))
	if raw, err := os.ReadFile(filepath.Join(dir, "cgroup")); err == nil {
		if match := podUIDRE.FindSubmatch(raw); match != nil {
			podUID = strings.ReplaceAll(strings.ToLower(string(match[1])), "_", "-")
		}
	}
	if raw, err := os.ReadFile(filepath.Join(dir, "environ")); err == nil {
		for _, kv := range bytes.Split(raw, []byte{0}) {
			if v, ok := bytes.CutPrefix(kv, []byte(configapi.EnvShareID+"=")); ok {
				shareID = string(v)
			}
		}
	}
	return podUID, shareID
}

// watchUsage samples the prepared shares every poll and publishes the summaries that are due;
// in observe mode, also those of the pods fgpu did not place (observer).
func (d *Driver) watchUsage(ctx context.Context, poll time.Duration) {
	ticker := time.NewTicker(poll)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		now := time.Now()
		claims := d.state.PreparedClaims()
		var others []string
		if d.observe != nil {
			others = d.observe.gpus()
		}
		due, unclaimed := d.usage.sample(ctx, now, claims, others)
		d.metrics.observeUsage(claims, d.usage.latest())
		for _, uid := range due {
			e := claims[uid]
			claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: e.Namespace, Name: e.Name, UID: types.UID(uid)}}
			sums := d.usage.summaries(uid, now)
			if err := d.publishDeviceStatusWith(ctx, claim, sums); err != nil {
				klog.FromContext(ctx).Error(err, "Publishing a claim's measured GPU use", "claim", klog.KRef(e.Namespace, e.Name))
				continue
			}
			d.usage.published(sums, now)
		}
		if d.observe != nil {
			d.observe.sample(now, unclaimed, func() []int { return d.state.foreign.ownServerPIDs(ctx) })
			if err := d.observe.publishIfDue(ctx, now); err != nil {
				klog.FromContext(ctx).Error(err, "Publishing the measured GPU use of the pods fgpu did not place")
			}
		}
	}
}
