package controller

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// write pins the claim: finalizers and the status annotation first, then the allocation
// (which carries the allocator's Placement), both guarded by the resourceVersion the
// decision was made on.
func (c *Controller) write(ctx context.Context, claim *resourceapi.ResourceClaim, d *decision, status string) error {
	cl := claim.DeepCopy()
	changed := false
	for _, f := range []string{api.FinalizerAllocator, resourceapi.Finalizer} {
		if !hasFinalizer(cl, f) {
			cl.Finalizers = append(cl.Finalizers, f)
			changed = true
		}
	}
	if cl.Annotations == nil {
		cl.Annotations = map[string]string{}
	}
	if cl.Annotations[api.AnnotationStatus] != status {
		// Written with the finalizer, in the same request: the status teller then has nothing to patch.
		cl.Annotations[api.AnnotationStatus] = status
		changed = true
	}
	if err := c.fenced(); err != nil {
		return err
	}
	if changed {
		updated, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).Update(ctx, cl, metav1.UpdateOptions{})
		if err != nil {
			return fmt.Errorf("add finalizer: %w", err)
		}
		cl = updated
	}
	alloc, err := c.allocation(claim, d)
	if err != nil {
		return err
	}
	cl.Status.Allocation = alloc
	if len(d.reservedFor) > 0 {
		cl.Status.ReservedFor = d.reservedFor
	}
	if err := c.fenced(); err != nil {
		return err
	}
	if _, err := c.client.ResourceV1().ResourceClaims(cl.Namespace).UpdateStatus(ctx, cl, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("write allocation: %w", err)
	}
	c.model.Written(claimKey(claim), c.now())
	return nil
}

// allocation builds status.allocation for a decision.
func (c *Controller) allocation(claim *resourceapi.ResourceClaim, d *decision) (*resourceapi.AllocationResult, error) {
	a := &resourceapi.AllocationResult{
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{d.node}}},
		}}},
		AllocationTimestamp: &metav1.Time{Time: c.now()},
	}
	seenClass := map[string]bool{}
	for _, r := range d.results {
		sid := r.shareID
		a.Devices.Results = append(a.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: r.request, Driver: c.cfg.DriverName, Pool: r.gpu.Key().Pool, Device: r.gpu.Key().Device,
			Tolerations: r.tolerations, ShareID: &sid,
			ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
				api.CapacityMemory:  *resource.NewQuantity(r.mem, resource.BinarySI),
				api.CapacityCompute: *resource.NewQuantity(r.comp, resource.DecimalSI),
			},
		})
		// The class's configs, as kube-scheduler copies them.
		if cls := classOfRequest(claim, r.request); cls != "" && !seenClass[r.request] {
			seenClass[r.request] = true
			if class, err := c.classes.Get(cls); err == nil {
				for _, cc := range class.Spec.Config {
					a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
						Source: resourceapi.AllocationConfigSourceClass, Requests: []string{r.request}, DeviceConfiguration: cc.DeviceConfiguration})
				}
			}
		}
	}
	// The user's own claim configs, kept.
	for _, cc := range claim.Spec.Devices.Config {
		a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: cc.Requests, DeviceConfiguration: cc.DeviceConfiguration})
	}
	// The allocator's config last: it overrides what the policy decides (mode, domain), and
	// records the rules the claim was placed under where tenants cannot write them.
	for _, r := range d.results {
		cfg := api.GpuConfig{TypeMeta: metav1.TypeMeta{APIVersion: api.SchemeGroupVersion.String(), Kind: api.GpuConfigKind},
			Mode: r.mode, IsolationDomain: r.domain.Sub, Placement: placementOf(d.pol)}
		if r.burstCap > 0 {
			cfg.Placement.MemoryLimit = resource.NewQuantity(r.burstCap, resource.BinarySI)
		}
		if r.userCfg != nil {
			// resolveRequest and limitsFit refused limits above the shares, as the plugin does.
			cfg.MemoryLimit, cfg.ComputePercent = r.userCfg.MemoryLimit, r.userCfg.ComputePercent
		}
		raw, err := json.Marshal(cfg)
		if err != nil {
			return nil, err
		}
		a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{r.request},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: c.cfg.DriverName, Parameters: runtime.RawExtension{Raw: raw}}},
		})
	}
	return a, nil
}

// classOfRequest is the class the claim's request (or alternative) named request asks for.
func classOfRequest(claim *resourceapi.ResourceClaim, request string) string {
	for _, r := range claim.Spec.Devices.Requests {
		for _, a := range alternatives(r) {
			if a.name == request {
				return a.class
			}
		}
	}
	return ""
}
