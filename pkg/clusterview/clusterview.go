// Package clusterview gathers who holds which GPU share from the API server: the GPUs the
// plugins publish and the claims allocated on them, with the pods that use them.
package clusterview

import (
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
)

// GPU is one published device and its tenants.
type GPU struct {
	Node, Device, Product string
	Memory                int64 // allocatable bytes
	Tenants               []Tenant
}

// Tenant is one allocated share.
type Tenant struct {
	Namespace, Claim string
	Pods             []string
	Memory           int64
	Compute          int64
	ShareID          string
	// Mode and MemoryEnforced come from the plugin's device status, once prepared.
	Mode string
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
	slices, err := c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list ResourceSlices: %w", err)
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
			if a, ok := d.Attributes["productName"]; ok && a.StringValue != nil {
				g.Product = *a.StringValue
			}
			if m, ok := d.Capacity[api.CapacityMemory]; ok {
				g.Memory = m.Value.Value()
			}
			byKey[key] = g
			order = append(order, key)
		}
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
			t := Tenant{Namespace: cl.Namespace, Claim: cl.Name, Memory: g.Memory, Mode: modeOf(cl, r)}
			if q, ok := r.ConsumedCapacity[api.CapacityMemory]; ok {
				t.Memory = q.Value()
			}
			if q, ok := r.ConsumedCapacity[api.CapacityCompute]; ok {
				t.Compute = q.Value()
			}
			if r.ShareID != nil {
				t.ShareID = string(*r.ShareID)
			}
			for _, ref := range cl.Status.ReservedFor {
				if ref.Resource == "pods" {
					t.Pods = append(t.Pods, ref.Name)
				}
			}
			g.Tenants = append(g.Tenants, t)
		}
	}
	sort.Strings(order)
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

func modeOf(cl resourceapi.ResourceClaim, r resourceapi.DeviceRequestAllocationResult) string {
	for _, d := range cl.Status.Devices {
		if d.Driver == r.Driver && d.Pool == r.Pool && d.Device == r.Device && d.Data != nil {
			var data struct {
				Mode string `json:"mode"`
			}
			if json.Unmarshal(d.Data.Raw, &data) == nil {
				return data.Mode
			}
		}
	}
	return "-"
}

// Print writes the GPUs and their tenants as a table.
func Print(w io.Writer, gpus []GPU) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE/GPU\tMODEL\tMEMORY USED/ALLOCATABLE\tCOMPUTE\tTENANT (ns/pod)\tMEMORY\tCOMPUTE\tMODE")
	for _, g := range gpus {
		mem, compute := g.Used()
		fmt.Fprintf(tw, "%s/%s\t%s\t%s / %s\t%d%%\t\t\t\t\n", g.Node, g.Device, g.Product, q(mem), q(g.Memory), compute)
		for _, t := range g.Tenants {
			who := t.Namespace + "/" + strings.Join(t.Pods, ",")
			if len(t.Pods) == 0 {
				who = t.Namespace + "/(claim " + t.Claim + ", no pod)"
			}
			fmt.Fprintf(tw, "\t\t\t\t%s\t%s\t%d%%\t%s\n", who, q(t.Memory), t.Compute, t.Mode)
		}
	}
	return tw.Flush()
}

func q(b int64) string { return resource.NewQuantity(b, resource.BinarySI).String() }
