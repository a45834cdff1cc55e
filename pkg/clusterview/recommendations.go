package clusterview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// Recommendation is a workload's newest recommendation, as the allocator last told it.
type Recommendation struct {
	api.SizingRecord
	At time.Time
}

// Recommendations reads the allocator's FgpuSizingRecommendation events (in namespace, or
// all with "") and keeps the newest per workload. Events age out (the API server's event
// TTL, an hour by default); the allocator tells a recommendation again when it moves.
func Recommendations(ctx context.Context, c kubernetes.Interface, namespace string) ([]Recommendation, error) {
	events, err := c.CoreV1().Events(namespace).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("reason", "FgpuSizingRecommendation").String()})
	if err != nil {
		return nil, fmt.Errorf("list events: %w", err)
	}
	newest := map[api.SizingWorkload]Recommendation{}
	for _, ev := range events.Items {
		// The chart's fgpu-events-in-fgpus-name policy admits an event in the allocator's
		// name from the allocator's service account only.
		if ev.Source.Component != "fgpu-allocator" && ev.ReportingController != "fgpu-allocator" {
			continue
		}
		var r api.SizingRecord
		if json.Unmarshal([]byte(ev.Annotations[api.AnnotationSizingRecord]), &r) != nil {
			continue
		}
		// The workload is in the event's namespace, whatever the annotation says.
		r.Workload.Namespace = ev.Namespace
		at := eventTime(ev)
		if cur, ok := newest[r.Workload]; !ok || at.After(cur.At) {
			newest[r.Workload] = Recommendation{SizingRecord: r, At: at}
		}
	}
	out := make([]Recommendation, 0, len(newest))
	for _, r := range newest {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Workload.String() < out[j].Workload.String() })
	return out, nil
}

func eventTime(ev corev1.Event) time.Time {
	for _, t := range []time.Time{ev.LastTimestamp.Time, ev.EventTime.Time, ev.FirstTimestamp.Time, ev.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}

// PrintRecommendations writes the recommendations as a table.
func PrintRecommendations(w io.Writer, recs []Recommendation, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tWORKLOAD\tREQUEST\tMEMORY\tCOMPUTE\tPEAK SEEN\tSAMPLES\tAGE")
	for _, r := range recs {
		fmt.Fprintf(tw, "%s\t%s/%s\t%s\t%s\t%d%%\t%s\t%d\t%s\n", r.Workload.Namespace, r.Workload.Kind, r.Workload.Name, r.Workload.Request,
			q(r.Recommendation.MemoryBytes), r.Recommendation.ComputePercent, q(r.Recommendation.PeakBytes), r.Recommendation.Samples,
			now.Sub(r.At).Truncate(time.Second))
	}
	return tw.Flush()
}
