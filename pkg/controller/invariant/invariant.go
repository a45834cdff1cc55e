// Package invariant checks what must hold for every fgpu allocation in a cluster, whoever
// made it: no share handed out twice, every allocated device exists, and no GPU holds more
// memory or compute than it has. Unit tests of the allocator call it after every step; the
// e2e suites call it on the live cluster.
package invariant

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Check checks the allocations of fgpu's driver in claims against the devices in slices.
func Check(claims []*resourceapi.ResourceClaim, slices []*resourceapi.ResourceSlice) error {
	return CheckDriver(api.DriverName, claims, slices)
}

type devKey struct{ pool, device string }

type usage struct {
	mem, compute          resource.Quantity
	memCap, computeCap    resource.Quantity
	hasMemCap, hasCompCap bool
	multi                 bool
	claims                []string
}

// CheckDriver is Check for any driver name. It reports every violation it finds.
func CheckDriver(driver string, claims []*resourceapi.ResourceClaim, slices []*resourceapi.ResourceSlice) error {
	devs := map[devKey]*usage{}
	for _, s := range slices {
		if s.Spec.Driver != driver {
			continue
		}
		for _, d := range s.Spec.Devices {
			u := &usage{multi: d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations}
			if c, ok := d.Capacity[api.CapacityMemory]; ok {
				u.memCap, u.hasMemCap = c.Value, true
			}
			if c, ok := d.Capacity[api.CapacityCompute]; ok {
				u.computeCap, u.hasCompCap = c.Value, true
			}
			devs[devKey{s.Spec.Pool.Name, d.Name}] = u
		}
	}
	var errs []error
	seenClaim := map[types.UID]string{}
	seenShare := map[types.UID]string{}
	for _, c := range claims {
		name := c.Namespace + "/" + c.Name
		if prev, ok := seenClaim[c.UID]; ok && c.UID != "" {
			errs = append(errs, fmt.Errorf("claim UID %s listed twice (%s, %s)", c.UID, prev, name))
			continue
		}
		seenClaim[c.UID] = name
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		nodes := map[string]bool{}
		for _, r := range a.Devices.Results {
			if r.Driver != driver {
				continue
			}
			nodes[r.Pool] = true
			k := devKey{r.Pool, r.Device}
			u, ok := devs[k]
			if !ok {
				errs = append(errs, fmt.Errorf("claim %s: allocated device %s/%s does not exist", name, r.Pool, r.Device))
				continue
			}
			if r.ShareID != nil {
				if prev, dup := seenShare[*r.ShareID]; dup {
					errs = append(errs, fmt.Errorf("shareID %s handed out twice (%s and %s)", *r.ShareID, prev, name))
				}
				seenShare[*r.ShareID] = name + "/" + r.Request
			} else if u.multi {
				errs = append(errs, fmt.Errorf("claim %s: share of %s/%s has no shareID", name, r.Pool, r.Device))
			}
			mem, comp := u.memCap, u.computeCap // no consumedCapacity: the whole device
			if r.ConsumedCapacity != nil {
				mem, comp = r.ConsumedCapacity[api.CapacityMemory], r.ConsumedCapacity[api.CapacityCompute]
			}
			if mem.Sign() < 0 || comp.Sign() < 0 {
				errs = append(errs, fmt.Errorf("claim %s: negative consumed capacity on %s/%s", name, r.Pool, r.Device))
			}
			u.mem.Add(mem)
			u.compute.Add(comp)
			u.claims = append(u.claims, name)
		}
		if a.NodeSelector != nil && len(nodes) > 0 {
			if n := selectedNode(a); n == "" {
				errs = append(errs, fmt.Errorf("claim %s: node selector does not name exactly one node", name))
			} else {
				for pool := range nodes {
					if pool != n {
						errs = append(errs, fmt.Errorf("claim %s: device of pool %s but node selector names %s", name, pool, n))
					}
				}
			}
		}
	}
	for k, u := range devs {
		if len(u.claims) > 1 && !u.multi {
			errs = append(errs, fmt.Errorf("device %s/%s allows one allocation but has %d: %v", k.pool, k.device, len(u.claims), u.claims))
		}
		if u.hasMemCap && u.mem.Cmp(u.memCap) > 0 {
			errs = append(errs, fmt.Errorf("GPU %s/%s over-committed: memory %s allocated of %s (%v)", k.pool, k.device, u.mem.String(), u.memCap.String(), u.claims))
		}
		if u.hasCompCap && u.compute.Cmp(u.computeCap) > 0 {
			errs = append(errs, fmt.Errorf("GPU %s/%s over-committed: compute %s allocated of %s (%v)", k.pool, k.device, u.compute.String(), u.computeCap.String(), u.claims))
		}
	}
	return errors.Join(errs...)
}

// selectedNode returns the node an allocation's selector pins it to (matchFields
// metadata.name In [one value]), or "".
func selectedNode(a *resourceapi.AllocationResult) string {
	if a.NodeSelector == nil || len(a.NodeSelector.NodeSelectorTerms) != 1 {
		return ""
	}
	t := a.NodeSelector.NodeSelectorTerms[0]
	if len(t.MatchExpressions) != 0 || len(t.MatchFields) != 1 {
		return ""
	}
	f := t.MatchFields[0]
	if f.Key != "metadata.name" || f.Operator != "In" || len(f.Values) != 1 {
		return ""
	}
	return f.Values[0]
}
