package clusterview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// UsageReport is the before and after of sizing from measured use: for each workload that
// holds GPUs through fgpu's claims, what it holds now, what it was measured using and the
// size fgpu recommends for it; for them all, the GPUs they hold now against the GPUs they
// would need at the recommended sizes.
type UsageReport struct {
	// Namespace is the one namespace reported on, "" for every namespace.
	Namespace string `json:"namespace,omitempty"`
	// Since is the window: only usage reports and recommendations newer than From count.
	Since     string           `json:"since"`
	From      time.Time        `json:"from"`
	To        time.Time        `json:"to"`
	Workloads []WorkloadReport `json:"workloads"`
	// GPUsHeld counts the GPUs the workloads' claims hold now, a GPU they share once;
	// MemoryHeldBytes is the memory the claims hold of them.
	GPUsHeld        int   `json:"gpusHeld"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// GPUsNeeded is how many of the cluster's GPUs the same workloads would take at the sizes
	// fgpu gives them: each share at its workload's recommended memory, at what it holds now
	// where its workload has no recommendation, a whole GPU where it holds one and its
	// workload KeepsWhole. Absent where no workload has a recommendation in the window, as
	// nothing would change.
	GPUsNeeded *int `json:"gpusNeeded,omitempty"`
	// UnplacedShares counts the shares the packing found no room for: GPUsNeeded leaves them out.
	UnplacedShares       int `json:"unplacedShares,omitempty"`
	MeasuredWorkloads    int `json:"measuredWorkloads"`
	RecommendedWorkloads int `json:"recommendedWorkloads"`
	// Notes say in words which figures are missing and why.
	Notes []string `json:"notes,omitempty"`
}

// WorkloadReport is one workload: the top owner of its claims' pods, as the allocator's
// recommendations name it (api.WorkloadOf), or ResourceClaim/<name> for a claim no pod uses.
type WorkloadReport struct {
	api.SizingWorkload
	// Shares counts its placed shares (a claim's GPU each), GPUs the distinct GPUs they are
	// on, MemoryHeldBytes what they hold (a whole GPU all its memory).
	Shares          int   `json:"shares"`
	GPUs            int   `json:"gpus"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// Used is what its shares used in the window; absent where none was measured.
	Used *MeasuredUse `json:"used,omitempty"`
	// Recommendation is the allocator's newest for it within the window; absent where none.
	Recommendation *api.SizingRecommendation `json:"recommendation,omitempty"`
	RecommendedAt  *time.Time                `json:"recommendedAt,omitempty"`
	// KeepsWhole: it holds whole GPUs and its recommendation says it keeps a GPU busy, so
	// they stay whole (as sizing's mode auto keeps them), and GPUsNeeded counts them so.
	KeepsWhole bool `json:"keepsWhole,omitempty"`
	// Observed: it holds its GPUs outside fgpu (NVIDIA's device plugin, whole GPUs), as the
	// kubelet plugins measured them; its recommendation is what fgpu would give it.
	Observed bool `json:"observed,omitempty"`
}

// MeasuredUse sums the newest usage report of each share measured in the window.
type MeasuredUse struct {
	// Shares counts the shares measured, MemoryHeldBytes what they hold: the memory figures
	// are theirs, against it.
	Shares          int   `json:"shares"`
	MemoryHeldBytes int64 `json:"memoryHeldBytes"`
	// MemoryP95Bytes sums each share's 95th percentile, MemoryPeakBytes each share's peak
	// (an upper bound: the peaks need not coincide).
	MemoryP95Bytes  int64 `json:"memoryP95Bytes"`
	MemoryPeakBytes int64 `json:"memoryPeakBytes"`
	// SMP95Percent is the highest share's 95th percentile of SM activity, SMMeanPercent the
	// mean over every share's samples; both absent where the driver gave no SM samples.
	SMP95Percent  *int      `json:"smP95Percent,omitempty"`
	SMMeanPercent *int      `json:"smMeanPercent,omitempty"`
	From          time.Time `json:"from"`
	To            time.Time `json:"to"`
}

// share is one placed share of a claim request, as the report counts and packs it.
type share struct {
	w     api.SizingWorkload
	gpus  []*GPU // one share asks for all of them on one node
	held  int64
	whole bool // it holds all of its GPUs' memory
	use   *api.ShareUsage
	// observed: a pod fgpu did not place, which holds its GPUs whole (observe mode).
	observed bool
}

// Report reads, with the caller's own client, the claims of namespace ("" for all) and the
// pods using them, the usage the kubelet plugin wrote into the claims' status and the
// allocator's recommendations, counting only those newer than since before now; and packs
// the recommended sizes onto the cluster's published GPUs.
//
// The GPU pods fgpu did not place (NVIDIA's device plugin's) count too where the kubelet
// plugins measured them (observe mode): from the ConfigMaps in fgpuNamespace, the chart's,
// which only the plugins write; each such pod is a share of the whole GPUs it holds.
func Report(ctx context.Context, c kubernetes.Interface, driver, fgpuNamespace, namespace string, since time.Duration, now time.Time) (*UsageReport, error) {
	if since <= 0 {
		return nil, fmt.Errorf("a window of %s: --since must be positive", since)
	}
	r := &UsageReport{Namespace: namespace, Since: window(since), From: now.Add(-since), To: now, Workloads: []WorkloadReport{}}
	gpus, order, err := published(ctx, c, driver)
	if err != nil {
		return nil, err
	}
	claims, err := c.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if namespace == "" && apierrors.IsForbidden(err) {
		return nil, fmt.Errorf("list ResourceClaims in every namespace: %w (name one you may read with -n)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	podList, err := c.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list pods: %w", err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range podList.Items {
		p := &podList.Items[i]
		pods[p.Namespace+"/"+p.Name] = p
	}
	shares := placedShares(claims.Items, driver, pods, gpus, r.From)
	observed, err := observedShares(ctx, c, fgpuNamespace, namespace, pods, gpus, r.From)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("GPU pods fgpu did not place are left out: %v", err))
	}
	shares = append(shares, observed...)
	recs, err := Recommendations(ctx, c, namespace)
	if err != nil {
		return nil, err
	}
	newest := map[api.SizingWorkload]Recommendation{}
	for _, rec := range recs {
		if !rec.At.Before(r.From) {
			newest[rec.Workload] = rec
		}
	}
	r.tally(shares, newest)
	if r.RecommendedWorkloads > 0 {
		all := make([]*GPU, 0, len(order))
		for _, k := range order {
			all = append(all, gpus[k])
		}
		needed, unplaced, err := r.pack(all, shares)
		if err != nil {
			return nil, err
		}
		r.GPUsNeeded, r.UnplacedShares = &needed, unplaced
	}
	r.explain(len(shares))
	return r, nil
}

// placedShares lists the shares of the driver's claims on the published GPUs, each with
// its workload and its newest usage report where it is not older than from.
func placedShares(claims []resourceapi.ResourceClaim, driver string, pods map[string]*corev1.Pod, gpus map[string]*GPU, from time.Time) []share {
	var out []share
	for i := range claims {
		cl := &claims[i]
		if cl.Status.Allocation == nil {
			continue
		}
		// One share per request: a request of several GPUs has them all on one node.
		byRequest := map[string]*share{}
		var requests []string
		for _, res := range cl.Status.Allocation.Devices.Results {
			g := gpus[res.Pool+"/"+res.Device]
			if res.Driver != driver || g == nil {
				continue
			}
			s := byRequest[res.Request]
			if s == nil {
				s = &share{w: workloadOf(cl, pods, res.Request), whole: true}
				byRequest[res.Request] = s
				requests = append(requests, res.Request)
			}
			s.gpus = append(s.gpus, g)
			held := heldMemory(res, g)
			s.held += held
			s.whole = s.whole && held >= g.Memory
			if data, ok := shareStatus(cl, res); ok && data.Usage != nil && !data.Usage.To.Before(from) {
				s.use = merged(s.use, data.Usage)
			}
		}
		for _, req := range requests {
			out = append(out, *byRequest[req])
		}
	}
	return out
}

// observedShares lists the GPU pods fgpu did not place in namespace ("" for all), as the
// kubelet plugins measured them into fgpuNamespace's observed-usage ConfigMaps: one share
// per pod, of the whole GPUs it uses, with its use where measured since from. A pod that
// no longer runs under the UID measured, or on GPUs no longer published, is left out.
func observedShares(ctx context.Context, c kubernetes.Interface, fgpuNamespace, namespace string, pods map[string]*corev1.Pod, gpus map[string]*GPU, from time.Time) ([]share, error) {
	maps, err := c.CoreV1().ConfigMaps(fgpuNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelObservedUsage})
	if err != nil {
		return nil, fmt.Errorf("list the observed-usage ConfigMaps in %s: %w", fgpuNamespace, err)
	}
	var out []share
	for _, cm := range maps.Items {
		node := cm.Labels[api.LabelObservedUsage]
		var u api.ObservedUsage
		if cm.Name != api.ObservedUsagePrefix+node || json.Unmarshal([]byte(cm.Data[api.ObservedUsageKey]), &u) != nil || u.Node != node {
			continue
		}
		for _, op := range u.Pods {
			p := pods[op.Namespace+"/"+op.Name]
			if (namespace != "" && op.Namespace != namespace) || p == nil || string(p.UID) != op.UID || p.Spec.NodeName != node {
				continue
			}
			s := share{w: api.WorkloadOf(p, api.ExtendedResourceRequest), whole: true, observed: true}
			for _, og := range op.GPUs {
				g := gpus[node+"/"+og.Device]
				if g == nil {
					continue
				}
				s.gpus = append(s.gpus, g)
				s.held += g.Memory
				if !og.Usage.To.Before(from) {
					s.use = merged(s.use, &og.Usage)
				}
			}
			if len(s.gpus) > 0 {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// workloadOf names the workload of a claim's request by the first of its pods that still
// exists, as the allocator's sizing does; a claim no pod uses is its own.
func workloadOf(cl *resourceapi.ResourceClaim, pods map[string]*corev1.Pod, request string) api.SizingWorkload {
	for _, ref := range cl.Status.ReservedFor {
		if p := pods[cl.Namespace+"/"+ref.Name]; ref.Resource == "pods" && p != nil && p.UID == ref.UID {
			return api.WorkloadOf(p, request)
		}
	}
	return api.SizingWorkload{Namespace: cl.Namespace, Kind: "ResourceClaim", Name: cl.Name, Request: request}
}

// merged is the usage of a share of several GPUs: their reports side by side, summed.
func merged(a, b *api.ShareUsage) *api.ShareUsage {
	if a == nil {
		u := *b
		return &u
	}
	u := *a
	if b.From.Before(u.From) {
		u.From = b.From
	}
	if b.To.After(u.To) {
		u.To = b.To
	}
	u.MemoryMaxBytes += b.MemoryMaxBytes
	u.MemoryP95Bytes += b.MemoryP95Bytes
	u.MemoryMeanBytes += b.MemoryMeanBytes
	if b.SMSamples > 0 {
		u.SMMeanPercent = (u.SMMeanPercent*u.SMSamples + b.SMMeanPercent*b.SMSamples) / (u.SMSamples + b.SMSamples)
		u.SMSamples += b.SMSamples
		u.SMP95Percent = max(u.SMP95Percent, b.SMP95Percent)
		u.SMMaxPercent = max(u.SMMaxPercent, b.SMMaxPercent)
	}
	u.Samples += b.Samples
	return &u
}

// tally sums the shares per workload and into the report's totals, and gives each workload
// its recommendation.
func (r *UsageReport) tally(shares []share, recs map[api.SizingWorkload]Recommendation) {
	type sums struct {
		WorkloadReport
		gpus  map[*GPU]bool
		whole bool // every share of it holds whole GPUs
		use   *api.ShareUsage
	}
	byWorkload := map[api.SizingWorkload]*sums{}
	held := map[*GPU]bool{}
	for _, s := range shares {
		w := byWorkload[s.w]
		if w == nil {
			w = &sums{WorkloadReport: WorkloadReport{SizingWorkload: s.w}, gpus: map[*GPU]bool{}, whole: true}
			byWorkload[s.w] = w
		}
		w.Shares++
		w.whole = w.whole && s.whole
		w.Observed = w.Observed || s.observed
		w.MemoryHeldBytes += s.held
		r.MemoryHeldBytes += s.held
		for _, g := range s.gpus {
			w.gpus[g], held[g] = true, true
		}
		if s.use != nil {
			if w.Used == nil {
				w.Used = &MeasuredUse{}
			}
			w.Used.Shares++
			w.Used.MemoryHeldBytes += s.held
			w.use = merged(w.use, s.use)
		}
	}
	r.GPUsHeld = len(held)
	for key, w := range byWorkload {
		w.GPUs = len(w.gpus)
		if rec, ok := recs[key]; ok {
			w.Recommendation, w.RecommendedAt = &rec.Recommendation, &rec.At
			w.KeepsWhole = w.whole && rec.Recommendation.ComputePercent >= engine.BusyComputePercent
			r.RecommendedWorkloads++
		}
		if u := w.use; u != nil {
			r.MeasuredWorkloads++
			w.Used.MemoryP95Bytes, w.Used.MemoryPeakBytes, w.Used.From, w.Used.To = u.MemoryP95Bytes, u.MemoryMaxBytes, u.From, u.To
			if u.SMSamples > 0 {
				w.Used.SMP95Percent, w.Used.SMMeanPercent = &u.SMP95Percent, &u.SMMeanPercent
			}
		}
		r.Workloads = append(r.Workloads, w.WorkloadReport)
	}
	sort.Slice(r.Workloads, func(i, j int) bool {
		return r.Workloads[i].String() < r.Workloads[j].String()
	})
}

// pack places every share at its workload's size on empty copies of the cluster's GPUs with
// the allocator's placement core, as it places best-effort claims (placement.Pack: the
// fullest GPU that still fits, on a GPU of the model the share is on now), largest first; it
// returns the GPUs taken and the shares that found no room.
func (r *UsageReport) pack(gpus []*GPU, shares []share) (needed, unplaced int, err error) {
	var specs []placement.NodeSpec
	for i, g := range gpus { // in name order, so a node's GPUs come together
		if i == 0 || g.Node != gpus[i-1].Node {
			specs = append(specs, placement.NodeSpec{Name: g.Node})
		}
		n := &specs[len(specs)-1]
		// The core counts in share units: here MiB, so that GPUs of any size pack exactly.
		n.GPUs = append(n.GPUs, placement.GPUSpec{Model: g.Product, Capacity: max(g.Memory>>20, 1)})
	}
	cluster, err := placement.NewCluster(specs)
	if err != nil {
		return 0, 0, fmt.Errorf("the cluster's GPUs for packing: %w", err)
	}
	workloads := map[api.SizingWorkload]WorkloadReport{}
	for _, w := range r.Workloads {
		workloads[w.SizingWorkload] = w
	}
	reqs := make([]*placement.Request, 0, len(shares))
	for _, s := range shares {
		req := &placement.Request{Name: s.w.String(), GPUs: len(s.gpus)}
		if p := s.gpus[0].Product; p != "" {
			req.Models = []string{p}
		}
		switch w := workloads[s.w]; {
		case s.whole && (w.KeepsWhole || w.Recommendation == nil):
			// Share 0 asks for whole GPUs.
		case w.Recommendation != nil:
			req.Share = mebibytes(w.Recommendation.MemoryBytes)
		default:
			req.Share = mebibytes(s.held / int64(len(s.gpus)))
		}
		reqs = append(reqs, req)
	}
	// Largest first: small shares then fill the room the large ones leave.
	amount := func(req *placement.Request) int64 {
		if req.Whole() {
			return math.MaxInt64
		}
		return req.Share
	}
	sort.SliceStable(reqs, func(i, j int) bool {
		if reqs[i].GPUs != reqs[j].GPUs {
			return reqs[i].GPUs > reqs[j].GPUs
		}
		return amount(reqs[i]) > amount(reqs[j])
	})
	sched := placement.NewScheduler(cluster, placement.Pack{}, 0)
	for _, req := range reqs {
		if _, err := sched.Allocate(req); err != nil {
			unplaced++
		}
	}
	for n := range cluster.Len() {
		free, capacity := cluster.GPUs(n)
		for g := range free {
			if free[g] < capacity[g] {
				needed++
			}
		}
	}
	return needed, unplaced, nil
}

func mebibytes(b int64) int64 { return max((b+(1<<20)-1)>>20, 1) }

// explain says in words which figures are missing; placed counts the shares found.
func (r *UsageReport) explain(placed int) {
	where := "in any namespace"
	if r.Namespace != "" {
		where = "in namespace " + r.Namespace
	}
	switch {
	case placed == 0:
		r.Notes = append(r.Notes, fmt.Sprintf("no GPU is held through fgpu's claims %s: nothing to report", where))
	case r.MeasuredWorkloads == 0:
		r.Notes = append(r.Notes, fmt.Sprintf("no GPU use measured in the last %s: of the %s placed %s, none has a usage report that recent "+
			"(the kubelet plugin writes one into the claim every 5 minutes while its use moves, every 30 minutes while it does not)", r.Since, plural(placed, "share"), where))
	case r.RecommendedWorkloads < len(r.Workloads):
		counted := ""
		if r.GPUsNeeded != nil {
			counted = ", counted at what they hold now"
		}
		r.Notes = append(r.Notes, fmt.Sprintf("workloads without a recommendation in the last %s: %d of %d%s "+
			"(fgpu recommends after half an hour of a workload's samples, and tells it again when it moves or every 30 minutes)",
			r.Since, len(r.Workloads)-r.RecommendedWorkloads, len(r.Workloads), counted))
	}
	if r.UnplacedShares > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("the cluster's GPUs have no room for %s at the recommended sizes: the GPUs needed leave them out", plural(r.UnplacedShares, "share")))
	}
}

// window is a duration as a person writes it: 24h, 1h30m, 90s as 1m30s.
func window(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// PrintReport writes the report for people: the GPUs held now against those needed in one
// sentence, what was measured, why figures are missing, then a row per workload within 80
// columns. A workload not measured in the window says so rather than showing zeros.
func PrintReport(w io.Writer, r *UsageReport) error {
	var b strings.Builder
	if len(r.Workloads) > 0 {
		wrap(&b, r.summary(), "", "")
	}
	if r.MeasuredWorkloads > 0 {
		wrap(&b, fmt.Sprintf("%d of %d workloads measured in the last %s, %d with a recommendation.",
			r.MeasuredWorkloads, len(r.Workloads), r.Since, r.RecommendedWorkloads), "", "")
	}
	for _, n := range r.Notes {
		wrap(&b, n+".", "", "  ")
	}
	if _, err := io.WriteString(w, b.String()); err != nil || len(r.Workloads) == 0 {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKLOAD\tGPUS\tHELD\tUSED P95/PEAK\tSM P95/MEAN\tFGPU SIZE")
	partly, observed := false, false
	for _, wl := range r.Workloads {
		name := wl.Namespace + "/" + wl.Kind + "/" + wl.Name
		if wl.Observed {
			name, observed = "+"+name, true
		}
		used, sm, size := "not measured", "-", "-"
		if u := wl.Used; u != nil {
			used = approx(u.MemoryP95Bytes) + "/" + approx(u.MemoryPeakBytes)
			if u.Shares < wl.Shares {
				used, partly = used+"*", true
			}
			if u.SMP95Percent != nil {
				sm = fmt.Sprintf("%d%%/%d%%", *u.SMP95Percent, *u.SMMeanPercent)
			}
		}
		if rec := wl.Recommendation; rec != nil {
			size = q(rec.MemoryBytes)
			if wl.Shares > 1 {
				size = fmt.Sprintf("%d×%s", wl.Shares, size)
			}
			if wl.KeepsWhole {
				size = "whole, busy"
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", fit(name, 28), wl.GPUs, q(wl.MemoryHeldBytes), used, sm, size)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if partly {
		if _, err := io.WriteString(w, "* only some of its shares measured in the window: the use is theirs alone\n"); err != nil {
			return err
		}
	}
	if observed {
		_, err := io.WriteString(w, "+ holds whole GPUs outside fgpu (NVIDIA's device plugin), measured in observe mode\n")
		return err
	}
	return nil
}

// summary is the GPUs held now against those needed, in words.
func (r *UsageReport) summary() string {
	now := fmt.Sprintf("%s held now (%s)", plural(r.GPUsHeld, "GPU"), q(r.MemoryHeldBytes))
	if r.GPUsNeeded == nil {
		return now + "; no workload has a recommendation to compare with."
	}
	need := *r.GPUsNeeded
	s := fmt.Sprintf("%s; %d would hold the same workloads at their measured sizes", now, need)
	switch d := r.GPUsHeld - need; {
	case d > 0:
		return s + fmt.Sprintf(" (%d fewer, %d %%).", d, d*100/r.GPUsHeld)
	case d < 0:
		return s + fmt.Sprintf(" (%d more: some use more than they hold).", -d)
	default:
		return s + " (no fewer)."
	}
}

// plural is n of a thing: 1 GPU, 2 GPUs.
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
