package clusterview

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// NamespaceQuota is a namespace's fgpu quota and what its claims hold against it, counted as
// the allocator counts it: every placed share of the driver, a whole GPU at its memory and
// 100% compute.
type NamespaceQuota struct {
	Namespace string `json:"namespace"`
	// MemoryQuota and ComputeQuota are nil where no SharingPolicy caps them; MemoryFrom and
	// ComputeFrom name the policy whose limit binds.
	MemoryQuota  *int64 `json:"memoryQuotaBytes,omitempty"`
	MemoryFrom   string `json:"memoryQuotaFrom,omitempty"`
	ComputeQuota *int64 `json:"computeQuotaPercent,omitempty"`
	ComputeFrom  string `json:"computeQuotaFrom,omitempty"`
	// Invalid names a policy whose quota does not validate: it holds the namespace's claims.
	Invalid     string `json:"invalid,omitempty"`
	MemoryUsed  int64  `json:"memoryUsedBytes"`
	ComputeUsed int64  `json:"computeUsedPercent"`
	Placed      int    `json:"placedClaims"`
	Waiting     int    `json:"waitingClaims"`
}

// Quotas reads each namespace's quota from the SharingPolicies and its usage from the
// placed claims: namespace alone, or ("") every namespace that has a quota or fgpu claims.
// SharingPolicies and namespaces are cluster-scoped: reading them takes a cluster role.
func Quotas(ctx context.Context, c kubernetes.Interface, fc versioned.Interface, driver, namespace string) ([]NamespaceQuota, error) {
	pl, err := fc.FgpuV1alpha1().SharingPolicies().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list SharingPolicies: %w", err)
	}
	policies := make([]*api.SharingPolicy, len(pl.Items))
	for i := range pl.Items {
		policies[i] = &pl.Items[i]
	}
	var namespaces []corev1.Namespace
	if namespace != "" {
		ns, err := c.CoreV1().Namespaces().Get(ctx, namespace, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get namespace: %w", err)
		}
		namespaces = []corev1.Namespace{*ns}
	} else {
		list, err := c.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list namespaces: %w", err)
		}
		namespaces = list.Items
	}
	gpus, err := Gather(ctx, c, driver)
	if err != nil {
		return nil, err
	}
	byNS := map[string]*NamespaceQuota{}
	for _, ns := range namespaces {
		nq := &NamespaceQuota{Namespace: ns.Name}
		q := policy.NamespaceQuota(policies, ns.Labels)
		if q.Memory != nil {
			v := q.Memory.Value()
			nq.MemoryQuota, nq.MemoryFrom = &v, q.MemoryFrom
		}
		if q.Compute != nil {
			v := *q.Compute
			nq.ComputeQuota, nq.ComputeFrom = &v, q.ComputeFrom
		}
		if q.Invalid != nil {
			nq.Invalid = q.Invalid.Error()
		}
		byNS[ns.Name] = nq
	}
	placed := map[string]bool{}
	for _, g := range gpus {
		for _, t := range g.Tenants {
			nq := byNS[t.Namespace]
			if nq == nil {
				continue
			}
			nq.MemoryUsed += max(t.Memory, t.BurstCap) // a bursting share is charged its cap, as the allocator counts
			nq.ComputeUsed += t.Compute
			if key := t.Namespace + "/" + t.Claim; !placed[key] {
				placed[key] = true
				nq.Placed++
			}
		}
	}
	claims, err := c.ResourceV1().ResourceClaims(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	for i := range claims.Items {
		cl := &claims.Items[i]
		if nq := byNS[cl.Namespace]; nq != nil && cl.Status.Allocation == nil && cl.DeletionTimestamp == nil && fgpuClaim(cl, driver) {
			nq.Waiting++
		}
	}
	out := make([]NamespaceQuota, 0, len(byNS))
	for _, nq := range byNS {
		if namespace == "" && nq.MemoryQuota == nil && nq.ComputeQuota == nil && nq.Invalid == "" && nq.Placed == 0 && nq.Waiting == 0 {
			continue
		}
		out = append(out, *nq)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Namespace < out[j].Namespace })
	return out, nil
}

// PrintQuotas writes the namespaces' quotas as a table within 80 columns, and under it each
// namespace that an invalid policy's quota holds.
func PrintQuotas(w io.Writer, quotas []NamespaceQuota) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tMEMORY USED/QUOTA\tCOMPUTE USED/QUOTA\tPLACED\tWAITING\tPOLICY")
	for _, nq := range quotas {
		mem, comp := q(nq.MemoryUsed)+"/-", fmt.Sprintf("%d%%/-", nq.ComputeUsed)
		if nq.MemoryQuota != nil {
			mem = fmt.Sprintf("%s/%s %d%%", q(nq.MemoryUsed), q(*nq.MemoryQuota), percent(nq.MemoryUsed, *nq.MemoryQuota))
		}
		if nq.ComputeQuota != nil {
			comp = fmt.Sprintf("%d%%/%d%%", nq.ComputeUsed, *nq.ComputeQuota)
		}
		from := nq.MemoryFrom
		if nq.ComputeFrom != "" && nq.ComputeFrom != from {
			from = strings.TrimPrefix(from+","+nq.ComputeFrom, ",")
		}
		if from == "" {
			from = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\n", fit(nq.Namespace, 18), mem, comp, nq.Placed, nq.Waiting, fit(from, 14))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var b strings.Builder
	for _, nq := range quotas {
		if nq.Invalid != "" {
			wrap(&b, fmt.Sprintf("%s: its claims wait: %s", nq.Namespace, nq.Invalid), "", "  ")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func percent(used, limit int64) int64 {
	if limit <= 0 {
		if used > 0 {
			return 100
		}
		return 0
	}
	return used * 100 / limit
}
