package clusterview

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
)

// UsageReport is the before and after of sizing from measured use (pkg/adoption, which the
// allocator's metrics count with too): for each workload that holds GPUs through fgpu's
// claims, or outside fgpu as its observe mode measured them, what it holds now, what it was
// measured using and the size fgpu recommends for it; for them all, the GPUs they hold now
// against the GPUs they would need at the recommended sizes.
type UsageReport struct {
	// Namespace is the one namespace reported on, "" for every namespace.
	Namespace string `json:"namespace,omitempty"`
	// Since is the window: only usage reports and recommendations newer than From count.
	Since string    `json:"since"`
	From  time.Time `json:"from"`
	To    time.Time `json:"to"`
	adoption.Summary
	// Notes say in words which figures are missing and why.
	Notes []string `json:"notes,omitempty"`
}

// WorkloadReport is one workload of the report.
type WorkloadReport = adoption.Workload

// MeasuredUse sums the newest usage report of each share measured in the window.
type MeasuredUse = adoption.MeasuredUse

// DefaultExtendedResource is the resource NVIDIA's device plugin serves whole GPUs (or their
// time-sliced replicas) as, and the chart's extendedResource.name by default.
const DefaultExtendedResource = adoption.DefaultExtendedResource

// Report reads, with the caller's own client, the claims of namespace ("" for all) and the
// pods using them, the usage the kubelet plugin wrote into the claims' status and the
// allocator's recommendations, counting only those newer than since before now; and packs
// the recommended sizes onto the cluster's published GPUs.
//
// The GPU pods fgpu did not place (NVIDIA's device plugin's) count too: each is a share of
// the GPUs its containers ask for as extendedResource (nvidia.com/gpu), with what the
// kubelet plugins measured of it (observe mode) from the ConfigMaps in fgpuNamespace, the
// chart's, which only the plugins write (adoption.ObservedShares says how shared GPUs count).
func Report(ctx context.Context, c kubernetes.Interface, driver, fgpuNamespace, extendedResource, namespace string, since time.Duration, now time.Time) (*UsageReport, error) {
	if since <= 0 {
		return nil, fmt.Errorf("a window of %s: --since must be positive", since)
	}
	r := &UsageReport{Namespace: namespace, Since: window(since), From: now.Add(-since), To: now}
	pub, order, err := published(ctx, c, driver)
	if err != nil {
		return nil, err
	}
	gpus := make(map[string]*adoption.GPU, len(order))
	all := make([]*adoption.GPU, 0, len(order))
	for _, k := range order {
		g := pub[k]
		a := &adoption.GPU{Node: g.Node, Device: g.Device, Product: g.Product, Memory: g.Memory}
		gpus[k], all = a, append(all, a)
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
	pod := func(ns, name string) *corev1.Pod { return pods[ns+"/"+name] }
	placed := adoption.PlacedShares(pointers(claims.Items), driver, pod, gpus, r.From)
	outside := adoption.Outside{FgpuNamespace: fgpuNamespace, Namespace: namespace, Resource: corev1.ResourceName(extendedResource),
		Pods: pointers(podList.Items), Node: func(name string) (*corev1.Node, error) {
			return c.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		}}
	if maps, err := c.CoreV1().ConfigMaps(fgpuNamespace).List(ctx, metav1.ListOptions{LabelSelector: api.LabelObservedUsage}); err != nil {
		outside.MapsErr = fmt.Errorf("list the observed-usage ConfigMaps in %s: %w", fgpuNamespace, err)
	} else {
		outside.Maps = pointers(maps.Items)
	}
	observed := adoption.ObservedShares(outside, all, r.From)
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
	sum, err := adoption.Summarize(all, placed, observed, func(w api.SizingWorkload) (api.SizingRecommendation, time.Time, bool) {
		rec, ok := newest[w]
		return rec.Recommendation, rec.At, ok
	})
	if err != nil {
		return nil, err
	}
	r.Summary = *sum
	r.explain(len(placed) + len(observed.Shares))
	r.Notes = append(r.Notes, observed.Notes...)
	return r, nil
}

// pointers is a list's items by address, as the shared computation takes them.
func pointers[T any](items []T) []*T {
	out := make([]*T, len(items))
	for i := range items {
		out[i] = &items[i]
	}
	return out
}

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
			"(the kubelet plugin writes one into the claim every usage.reportInterval while its use moves, every usage.heartbeat while it does not: 5 and 30 minutes unless the chart sets others)", r.Since, plural(placed, "share"), where))
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
	partly, observed, sliced := false, false, false
	for _, wl := range r.Workloads {
		name := wl.Namespace + "/" + wl.Kind + "/" + wl.Name
		if wl.Observed {
			name, observed = "+"+name, true
		}
		used, sm, size := "not measured", "-", "-"
		if wl.NoSamples == wl.Shares {
			used = "no samples"
		}
		gpus := fmt.Sprint(wl.GPUs)
		if wl.TimeSliced {
			gpus, sliced = gpus+"~", true
		}
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
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", fit(name, 28), gpus, q(wl.MemoryHeldBytes), used, sm, size)
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
		if _, err := io.WriteString(w, "+ holds GPUs outside fgpu (NVIDIA's device plugin), as its pods ask for them;\n"+
			"  measured in observe mode (no samples: it ran nothing seen in the window)\n"); err != nil {
			return err
		}
	}
	if sliced {
		_, err := io.WriteString(w, "~ the device plugin shares its GPUs (time-slicing, MPS): each counts once, whole\n")
		return err
	}
	return nil
}

// summary is the GPUs held now against those needed, in words.
func (r *UsageReport) summary() string {
	now := fmt.Sprintf("%s held now (%s)", plural(r.GPUsHeld, "GPU"), q(r.MemoryHeldBytes))
	if r.GPUsHeldAtMost != nil {
		now = fmt.Sprintf("%d to %d GPUs held now (at least %s)", r.GPUsHeld, *r.GPUsHeldAtMost, q(r.MemoryHeldBytes))
	}
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
