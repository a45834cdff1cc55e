// Package clusterview gathers who holds which GPU share from the API server: the GPUs the
// plugins publish and the claims allocated on them, with the pods that use them.
package clusterview

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
)

// GPU is one published device and its tenants.
type GPU struct {
	Node    string   `json:"node"`
	Device  string   `json:"device"`
	Product string   `json:"product,omitempty"`
	Memory  int64    `json:"memoryBytes"` // allocatable
	Compute int64    `json:"computePercent"`
	Tenants []Tenant `json:"tenants"`
}

// Tenant is one allocated share.
type Tenant struct {
	Namespace string   `json:"namespace"`
	Claim     string   `json:"claim"`
	Pods      []string `json:"pods"`
	Memory    int64    `json:"memoryBytes"`
	Compute   int64    `json:"computePercent"`
	ShareID   string   `json:"shareID,omitempty"`
	// BurstCap is a bursting share's memory cap, above Memory (what it is guaranteed and
	// the allocator counts); 0 for any other share.
	BurstCap int64 `json:"memoryBurstCapBytes,omitempty"`
	// Mode comes from the plugin's device status, once prepared ("-" before).
	Mode string `json:"mode"`
}

// Used sums the tenants' memory and compute.
func (g GPU) Used() (mem, compute int64) {
	for _, t := range g.Tenants {
		mem += t.Memory
		compute += t.Compute
	}
	return mem, compute
}

// Gather lists the driver's GPUs and their tenants.
func Gather(ctx context.Context, c kubernetes.Interface, driver string) ([]GPU, error) {
	byKey, order, err := published(ctx, c, driver)
	if err != nil {
		return nil, err
	}
	claims, err := c.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceClaims: %w", err)
	}
	for _, cl := range claims.Items {
		if cl.Status.Allocation == nil {
			continue
		}
		for _, r := range cl.Status.Allocation.Devices.Results {
			g := byKey[r.Pool+"/"+r.Device]
			if r.Driver != driver || g == nil {
				continue
			}
			t := Tenant{Namespace: cl.Namespace, Claim: cl.Name, Memory: adoption.HeldMemory(r, g.Memory), Compute: g.Compute, Mode: modeOf(cl, r), Pods: []string{}}
			if len(r.ConsumedCapacity) > 0 {
				t.Compute = 0
			}
			if q, ok := r.ConsumedCapacity[api.CapacityCompute]; ok {
				t.Compute = q.Value()
			}
			if r.ShareID != nil {
				t.ShareID = string(*r.ShareID)
			}
			t.BurstCap = burstCap(cl.Status.Allocation, driver, r.Request)
			for _, ref := range cl.Status.ReservedFor {
				if ref.Resource == "pods" {
					t.Pods = append(t.Pods, ref.Name)
				}
			}
			g.Tenants = append(g.Tenants, t)
		}
	}
	out := make([]GPU, 0, len(order))
	for _, k := range order {
		g := byKey[k]
		sort.Slice(g.Tenants, func(i, j int) bool {
			return g.Tenants[i].Namespace+g.Tenants[i].Claim < g.Tenants[j].Namespace+g.Tenants[j].Claim
		})
		out = append(out, *g)
	}
	return out, nil
}

// published lists the GPUs the driver's ResourceSlices publish, by pool/device, with the
// keys in name order; their tenants are left to the caller.
func published(ctx context.Context, c kubernetes.Interface, driver string) (map[string]*GPU, []string, error) {
	slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list ResourceSlices: %w", err)
	}
	byKey := map[string]*GPU{}
	var order []string
	for _, s := range slices.Items {
		if s.Spec.Driver != driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			key := s.Spec.Pool.Name + "/" + d.Name
			g := &GPU{Node: s.Spec.Pool.Name, Device: d.Name}
			if a, ok := d.Attributes[api.AttributeProductName]; ok && a.StringValue != nil {
				g.Product = *a.StringValue
			}
			if m, ok := d.Capacity[api.CapacityMemory]; ok {
				g.Memory = m.Value.Value()
			}
			g.Compute = 100
			if c, ok := d.Capacity[api.CapacityCompute]; ok {
				g.Compute = c.Value.Value()
			}
			byKey[key] = g
			order = append(order, key)
		}
	}
	sort.Strings(order)
	return byKey, order, nil
}

func modeOf(cl resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) string {
	for _, d := range cl.Status.Devices {
		if d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device && d.Data != nil {
			var data api.DeviceStatusData
			if json.Unmarshal(d.Data.Raw, &data) == nil {
				return data.Mode
			}
		}
	}
	return "-"
}

// Print writes the GPUs and their tenants as a table that fits 80 columns: a row per GPU,
// then one per tenant (namespace/pods, or the claim while no pod uses it).
func Print(w io.Writer, gpus []GPU) error {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GPU / TENANT\tMEMORY\tCOMPUTE\tMODE")
	for _, g := range gpus {
		mem, compute := g.Used()
		name := g.Node + "/" + g.Device
		if g.Product != "" {
			name += " (" + g.Product + ")"
		}
		fmt.Fprintf(tw, "%s\t%s/%s\t%d%%\t\n", fit(name, nameWidth), q(mem), q(g.Memory), compute)
		for _, t := range g.Tenants {
			who := t.Namespace + "/" + strings.Join(t.Pods, ",")
			if len(t.Pods) == 0 {
				who = t.Namespace + "/claim " + t.Claim + " (no pod)"
			}
			mem := q(t.Memory)
			if t.BurstCap > 0 {
				mem += ", burst to " + q(t.BurstCap)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d%%\t%s\n", fit(who, nameWidth-2), mem, t.Compute, t.Mode)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// A GPU's row has no mode: its cell must still end with a tab to keep the column
	// aligned, and the padding it gets is cut here.
	for line := range strings.Lines(buf.String()) {
		if _, err := io.WriteString(w, strings.TrimRight(line, " \n")+"\n"); err != nil {
			return err
		}
	}
	return nil
}

// nameWidth is the widest name column that keeps a table within 80 columns.
const nameWidth = 40

// fit shortens s to n runes by cutting out its middle, which keeps both a name's start and
// the generated suffix that tells its pods apart.
func fit(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	head := (n - 1) / 2
	return string(r[:head]) + "…" + string(r[len(r)-(n-1-head):])
}

// burstCap is the burst cap the allocator placed a request's share with (0: none).
func burstCap(a *resourceapi.AllocationResult, driver, request string) int64 {
	cfg, err := api.MergeConfigs(driver, a.Devices.Config, request)
	if err != nil || cfg.Placement == nil || cfg.Placement.MemoryLimit == nil {
		return 0
	}
	return cfg.Placement.MemoryLimit.Value()
}

func q(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
