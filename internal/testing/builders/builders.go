// Package builders makes the API objects fgpu's tests start from, in the style of kueue's
// test wrappers: MakeClaim("ns", "c").Memory("10Gi").AllocatedOn("n1", "gpu-0").Obj().
// The allocator's, the plugin's and the e2e tests share it, so a claim, a GPU slice or a
// policy means the same thing in each.
package builders

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Created is every claim's creation time unless ClaimBuilder.Created moves it.
var Created = metav1.Date(2026, 1, 1, 0, 0, 0, 0, time.Local)

// NodeBuilder: MakeNode("n1").CPU("8").Obj().
type NodeBuilder struct{ n *corev1.Node }

// MakeNode starts a node with 16 CPUs, 64Gi of memory and room for 110 pods.
func MakeNode(name string) *NodeBuilder {
	return &NodeBuilder{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("node-" + name), Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")}}}}
}

// CPU sets the node's allocatable CPU.
func (b *NodeBuilder) CPU(q string) *NodeBuilder {
	b.n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

// Label sets a node label.
func (b *NodeBuilder) Label(k, v string) *NodeBuilder { b.n.Labels[k] = v; return b }

// Pods sets how many pods the node takes.
func (b *NodeBuilder) Pods(n int64) *NodeBuilder {
	b.n.Status.Allocatable[corev1.ResourcePods] = *resource.NewQuantity(n, resource.DecimalSI)
	return b
}

// Taint adds a NoSchedule taint.
func (b *NodeBuilder) Taint(k, v string) *NodeBuilder {
	b.n.Spec.Taints = append(b.n.Spec.Taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffectNoSchedule})
	return b
}

// Obj returns the node.
func (b *NodeBuilder) Obj() *corev1.Node { return b.n }

// MakeSlice publishes n GPUs of mem allocatable memory on node, as the plugin does in
// allocator mode (fenced).
func MakeSlice(node string, n int, mem string) *resourceapi.ResourceSlice {
	m := resource.MustParse(mem)
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + api.DriverName},
		Spec: resourceapi.ResourceSliceSpec{Driver: api.DriverName, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := 0; i < n; i++ {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i), AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))}, "productName": {StringValue: ptr.To("H100")}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				api.CapacityMemory:  {Value: m, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &m}},
				api.CapacityCompute: {Value: resource.MustParse("100")},
			},
			Taints: []resourceapi.DeviceTaint{api.FenceTaint()},
		})
	}
	return s
}

// MakeClass is a DeviceClass that selects the driver's devices.
func MakeClass(name string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf("device.driver == %q", api.DriverName)}}}}}
}

// ClaimBuilder: MakeClaim("ns", "c").Memory("10Gi").Obj().
type ClaimBuilder struct{ c *resourceapi.ResourceClaim }

// MakeClaim starts a claim with one request "gpu" for one device of the share class.
func MakeClaim(ns, name string) *ClaimBuilder {
	return &ClaimBuilder{&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("claim-" + ns + "-" + name), CreationTimestamp: Created},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: api.DeviceClassShared, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}}
}

func (b *ClaimBuilder) req() *resourceapi.ExactDeviceRequest {
	return b.c.Spec.Devices.Requests[0].Exactly
}

func (b *ClaimBuilder) capacity(k resourceapi.QualifiedName, q string) *ClaimBuilder {
	r := b.req()
	if r.Capacity == nil {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	}
	r.Capacity.Requests[k] = resource.MustParse(q)
	return b
}

// Memory asks for device memory.
func (b *ClaimBuilder) Memory(q string) *ClaimBuilder { return b.capacity(api.CapacityMemory, q) }

// Compute asks for a percent of the GPU's SMs.
func (b *ClaimBuilder) Compute(q string) *ClaimBuilder { return b.capacity(api.CapacityCompute, q) }

// Class sets the request's DeviceClass.
func (b *ClaimBuilder) Class(c string) *ClaimBuilder { b.req().DeviceClassName = c; return b }

// Toleration adds a device toleration to the request.
func (b *ClaimBuilder) Toleration(t resourceapi.DeviceToleration) *ClaimBuilder {
	r := b.req()
	r.Tolerations = append(r.Tolerations, t)
	return b
}

// Created sets the creation time to sec seconds after Created.
func (b *ClaimBuilder) Created(sec int) *ClaimBuilder {
	b.c.CreationTimestamp = metav1.NewTime(Created.Add(time.Duration(sec) * time.Second))
	return b
}

// Config adds an fgpu opaque config; fields is the GpuConfig body.
func (b *ClaimBuilder) Config(fields map[string]any) *ClaimBuilder {
	b.c.Spec.Devices.Config = append(b.c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{DeviceConfiguration: gpuConfig(fields)})
	return b
}

// AllocatorConfig adds an fgpu config to the allocation only, last, as the allocator writes
// its own (claim's spec untouched: what its tenant cannot write). Call it after AllocatedOn.
func (b *ClaimBuilder) AllocatorConfig(fields map[string]any) *ClaimBuilder {
	a := b.c.Status.Allocation
	a.Devices.Config = append(a.Devices.Config, resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim, Requests: []string{a.Devices.Results[0].Request}, DeviceConfiguration: gpuConfig(fields)})
	return b
}

func gpuConfig(fields map[string]any) resourceapi.DeviceConfiguration {
	body := map[string]any{"apiVersion": api.SchemeGroupVersion.String(), "kind": api.GpuConfigKind}
	for k, v := range fields {
		body[k] = v
	}
	raw, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: api.DriverName, Parameters: runtime.RawExtension{Raw: raw}}}
}

// AllocatedOn allocates the claim on a device of node as kube-scheduler would (no allocator
// markers): the memory and compute it asks for are consumed (compute 0 when it names
// none), its configs are copied into the allocation, and its share ID is a UUID derived
// from its namespace and name. Call it after the methods that shape the request.
func (b *ClaimBuilder) AllocatedOn(node, device string) *ClaimBuilder {
	consumed := map[resourceapi.QualifiedName]resource.Quantity{api.CapacityCompute: resource.MustParse("0")}
	if r := b.req(); r.Capacity != nil {
		for k, q := range r.Capacity.Requests {
			consumed[k] = q.DeepCopy()
		}
	}
	sid := types.UID(uuid.NewSHA1(uuid.NameSpaceOID, []byte(b.c.Namespace+"/"+b.c.Name)).String())
	alloc := &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: api.DriverName, Pool: node, Device: device, ShareID: &sid, ConsumedCapacity: consumed,
		}}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{
			Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}},
	}
	for _, c := range b.c.Spec.Devices.Config {
		alloc.Devices.Config = append(alloc.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source: resourceapi.AllocationConfigSourceClaim, Requests: c.Requests, DeviceConfiguration: *c.DeviceConfiguration.DeepCopy()})
	}
	b.c.Status.Allocation = alloc
	return b
}

// ShareID replaces the share ID AllocatedOn gave the claim.
func (b *ClaimBuilder) ShareID(sid string) *ClaimBuilder {
	id := types.UID(sid)
	b.c.Status.Allocation.Devices.Results[0].ShareID = &id
	return b
}

// Obj returns the claim.
func (b *ClaimBuilder) Obj() *resourceapi.ResourceClaim { return b.c }

// PodBuilder: MakePod("ns", "p").Claim("c").Obj().
type PodBuilder struct{ p *corev1.Pod }

// MakePod starts a pod with one container that requests 100m CPU.
func MakePod(ns, name string) *PodBuilder {
	return &PodBuilder{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pod-" + ns + "-" + name), Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("100m")}}}}}}}
}

// Claim makes the pod use the named ResourceClaim.
func (b *PodBuilder) Claim(name string) *PodBuilder {
	b.p.Spec.ResourceClaims = append(b.p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimName: ptr.To(name)})
	return b
}

// CPU sets the container's CPU request.
func (b *PodBuilder) CPU(q string) *PodBuilder {
	b.p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}

// Label sets a pod label.
func (b *PodBuilder) Label(k, v string) *PodBuilder { b.p.Labels[k] = v; return b }

// NodeSelector adds a node selector term.
func (b *PodBuilder) NodeSelector(k, v string) *PodBuilder {
	if b.p.Spec.NodeSelector == nil {
		b.p.Spec.NodeSelector = map[string]string{}
	}
	b.p.Spec.NodeSelector[k] = v
	return b
}

// Bound binds the pod to node.
func (b *PodBuilder) Bound(node string) *PodBuilder {
	b.p.Spec.NodeName = node
	b.p.Status.HostIP = "192.0.2.1" // as the node's kubelet writes it once it took the pod
	return b
}

// Obj returns the pod.
func (b *PodBuilder) Obj() *corev1.Pod { return b.p }

// PolicyBuilder: MakePolicy("p").Isolation(api.IsolationNone).Obj().
type PolicyBuilder struct{ p *api.SharingPolicy }

// MakePolicy starts a SharingPolicy that sets nothing (every default applies).
func MakePolicy(name string) *PolicyBuilder {
	return &PolicyBuilder{&api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}

// Isolation sets the isolation.
func (b *PolicyBuilder) Isolation(i api.Isolation) *PolicyBuilder { b.p.Spec.Isolation = i; return b }

// AllowShared sets allowSharedGPU.
func (b *PolicyBuilder) AllowShared() *PolicyBuilder { b.p.Spec.AllowSharedGPU = true; return b }

// Latency sets the latency class.
func (b *PolicyBuilder) Latency(l api.LatencyClass) *PolicyBuilder {
	b.p.Spec.LatencyClass = l
	return b
}

// MaxCo sets maxCoTenants.
func (b *PolicyBuilder) MaxCo(n int32) *PolicyBuilder { b.p.Spec.MaxCoTenants = &n; return b }

// MaxTenants sets maxTenantsPerGPU.
func (b *PolicyBuilder) MaxTenants(n int32) *PolicyBuilder { b.p.Spec.MaxTenantsPerGPU = &n; return b }

// Mode sets the mode.
func (b *PolicyBuilder) Mode(m api.PolicyMode) *PolicyBuilder {
	b.p.Spec.Mode = m
	return b
}

// ComputeFromMemory sets computeFromMemory.
func (b *PolicyBuilder) ComputeFromMemory() *PolicyBuilder {
	b.p.Spec.ComputeFromMemory = true
	return b
}

// Sizing sets the sizing mode.
func (b *PolicyBuilder) Sizing(m api.SizingMode) *PolicyBuilder { b.p.Spec.Sizing = m; return b }

// IdleScaleDown scales opted-in workloads idle (no SM activity) for after to zero.
func (b *PolicyBuilder) IdleScaleDown(after time.Duration) *PolicyBuilder {
	b.p.Spec.IdleScaleDown = &api.IdleScaleDown{After: metav1.Duration{Duration: after}}
	return b
}

// Priority sets the priority.
func (b *PolicyBuilder) Priority(p int32) *PolicyBuilder { b.p.Spec.Priority = p; return b }

// Pods selects pods by one label.
func (b *PolicyBuilder) Pods(k, v string) *PolicyBuilder {
	b.p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	return b
}

// Namespaces selects namespaces by one label.
func (b *PolicyBuilder) Namespaces(k, v string) *PolicyBuilder {
	b.p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	return b
}

// QuotaMemory sets the memory quota.
func (b *PolicyBuilder) QuotaMemory(q string) *PolicyBuilder {
	if b.p.Spec.Quota == nil {
		b.p.Spec.Quota = &api.Quota{}
	}
	m := resource.MustParse(q)
	b.p.Spec.Quota.Memory = &m
	return b
}

// QuotaCompute sets the compute quota (percent; 100 = one whole GPU).
func (b *PolicyBuilder) QuotaCompute(percent int64) *PolicyBuilder {
	if b.p.Spec.Quota == nil {
		b.p.Spec.Quota = &api.Quota{}
	}
	b.p.Spec.Quota.Compute = &percent
	return b
}

// RefuseHeldRoom sets the quota's heldRoom to Refuse.
func (b *PolicyBuilder) RefuseHeldRoom() *PolicyBuilder {
	if b.p.Spec.Quota == nil {
		b.p.Spec.Quota = &api.Quota{}
	}
	b.p.Spec.Quota.HeldRoom = api.HeldRoomRefuse
	return b
}

// DefaultCompute sets the compute a share that asks none gets.
func (b *PolicyBuilder) DefaultCompute(percent int32) *PolicyBuilder {
	b.p.Spec.DefaultCompute = &percent
	return b
}

// Obj returns the policy.
func (b *PolicyBuilder) Obj() *api.SharingPolicy { return b.p }
