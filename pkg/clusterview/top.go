package clusterview

import (
	"context"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
)

// ShareUse is one placed share against its caps: what the allocator gave it (its
// allocation's consumed capacity) and what the kubelet plugin measured (the usage summary it
// writes into the claim's status.devices, which only the plugin may write).
type ShareUse struct {
	Namespace string   `json:"namespace"`
	Claim     string   `json:"claim"`
	Pods      []string `json:"pods"`
	GPU       string   `json:"gpu"` // node/device
	Mode      string   `json:"mode"`
	// MemoryCap and ComputeCap are the share's size (a whole GPU: its memory, 100%); for a
	// bursting share MemoryCap is its burst cap, and MemoryGuaranteed what it is guaranteed.
	MemoryCap        int64 `json:"memoryCapBytes"`
	MemoryGuaranteed int64 `json:"memoryGuaranteedBytes,omitempty"`
	ComputeCap       int64 `json:"computeCapPercent"`
	// Usage is nil until the plugin has measured the share for a report interval.
	Usage *api.ShareUsage `json:"usage,omitempty"`
}

// Top lists the placed shares of the driver's claims in namespace ("" for all), with their
// measured use where the plugin reported it.
func Top(ctx context.Context, c kubernetes.Interface, driver, namespace string) ([]ShareUse, error) {
	claims, err := c.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	out := []ShareUse{} // -o json: [] rather than null
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		pods := []string{}
		for _, ref := range cl.Status.ReservedFor {
			if ref.Resource == "pods" {
				pods = append(pods, ref.Name)
			}
		}
		for _, res := range cl.Status.Allocation.Devices.Results {
			if res.Driver != driver {
				continue
			}
			s := ShareUse{Namespace: cl.Namespace, Claim: cl.Name, Pods: pods, GPU: res.Pool + "/" + res.Device, Mode: "-", ComputeCap: 100}
			if m, ok := res.ConsumedCapacity[api.CapacityMemory]; ok {
				s.MemoryCap = m.Value()
				s.ComputeCap = 0
				if c, ok := res.ConsumedCapacity[api.CapacityCompute]; ok {
					s.ComputeCap = c.Value()
				}
			}
			if b := burstCap(cl.Status.Allocation, driver, res.Request); b > 0 {
				s.MemoryGuaranteed, s.MemoryCap = s.MemoryCap, b
			}
			if data, ok := adoption.ShareStatus(&cl, res); ok {
				if data.Mode != "" {
					s.Mode = data.Mode
				}
				s.Usage = data.Usage
			}
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		if a.Claim != b.Claim {
			return a.Claim < b.Claim
		}
		return a.GPU < b.GPU
	})
	return out, nil
}

// PrintTop writes the shares as a table within 80 columns: memory is the peak measured in
// the last report against the cap (and its percent of it), SM the 95th percentile of the SM
// activity against the compute share; "-" where nothing was measured yet.
func PrintTop(w io.Writer, shares []ShareUse, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLAIM\tMEMORY MAX/CAP\tSM P95/CAP\tMEASURED")
	for _, s := range shares {
		capComp := fmt.Sprintf("%d%%", s.ComputeCap)
		mem, sm, when := "-/"+q(s.MemoryCap), "-/"+capComp, "-"
		if u := s.Usage; u != nil {
			mem = approx(u.MemoryMaxBytes) + "/" + q(s.MemoryCap)
			if s.MemoryCap > 0 {
				mem += fmt.Sprintf(" %d%%", u.MemoryMaxBytes*100/s.MemoryCap)
			}
			if u.SMSamples > 0 {
				sm = fmt.Sprintf("%d%%/%s", u.SMP95Percent, capComp)
			}
			when = age(now.Sub(u.To)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", fit(s.Namespace, 14), fit(s.Claim, 22), mem, sm, when)
	}
	return tw.Flush()
}

// approx is a measured byte count as a person reads it: 7.5Gi, 300Mi (measurements are not
// round numbers, and their exact bytes would not fit a column).
func approx(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1fGi", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%dMi", b>>20)
	default:
		return fmt.Sprintf("%dKi", b>>10)
	}
}
