package controller

import (
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

const (
	driver     = "gpu.fgpu.dev"
	shareClass = "gpu.fgpu.dev"
	wholeClass = "exclusive.gpu.fgpu.dev"
)

var created = metav1.Date(2026, 1, 1, 0, 0, 0, 0, metav1.Now().Location())

// NodeBuilder: MakeNode("n1").CPU("8").Obj().
type NodeBuilder struct{ n *corev1.Node }

func MakeNode(name string) *NodeBuilder {
	return &NodeBuilder{&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("node-" + name), Labels: map[string]string{"kubernetes.io/hostname": name}},
		Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi"), corev1.ResourcePods: resource.MustParse("110")}}}}
}
func (b *NodeBuilder) CPU(q string) *NodeBuilder {
	b.n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}
func (b *NodeBuilder) Label(k, v string) *NodeBuilder { b.n.Labels[k] = v; return b }
func (b *NodeBuilder) Taint(k, v string) *NodeBuilder {
	b.n.Spec.Taints = append(b.n.Spec.Taints, corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffectNoSchedule})
	return b
}
func (b *NodeBuilder) Obj() *corev1.Node { return b.n }

// MakeSlice publishes n GPUs of mem allocatable memory on node, as the plugin does in
// allocator mode.
func MakeSlice(node string, n int, mem string) *resourceapi.ResourceSlice {
	m := resource.MustParse(mem)
	s := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1}}}
	for i := 0; i < n; i++ {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i), AllowMultipleAllocations: ptr.To(true),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"index": {IntValue: ptr.To(int64(i))}, "productName": {StringValue: ptr.To("H100")}},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				api.CapacityMemory:  {Value: m, RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &m}},
				api.CapacityCompute: {Value: resource.MustParse("100")},
			},
			Taints: []resourceapi.DeviceTaint{{Key: api.FenceTaintKey, Value: api.FenceTaintValue, Effect: resourceapi.DeviceTaintEffectNoSchedule}},
		})
	}
	return s
}

func MakeClass(name string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.fgpu.dev"`}}}}}
}

// ClaimBuilder: MakeClaim("ns", "c").Memory("10Gi").Obj().
type ClaimBuilder struct{ c *resourceapi.ResourceClaim }

func MakeClaim(ns, name string) *ClaimBuilder {
	return &ClaimBuilder{&resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("claim-" + ns + "-" + name), CreationTimestamp: created},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: shareClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		}}}},
	}}
}
func (b *ClaimBuilder) req() *resourceapi.ExactDeviceRequest {
	return b.c.Spec.Devices.Requests[0].Exactly
}
func (b *ClaimBuilder) capa(k resourceapi.QualifiedName, q string) *ClaimBuilder {
	r := b.req()
	if r.Capacity == nil {
		r.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
	}
	r.Capacity.Requests[k] = resource.MustParse(q)
	return b
}
func (b *ClaimBuilder) Memory(q string) *ClaimBuilder  { return b.capa(api.CapacityMemory, q) }
func (b *ClaimBuilder) Compute(q string) *ClaimBuilder { return b.capa(api.CapacityCompute, q) }
func (b *ClaimBuilder) Class(c string) *ClaimBuilder   { b.req().DeviceClassName = c; return b }
func (b *ClaimBuilder) Created(sec int) *ClaimBuilder {
	b.c.CreationTimestamp = metav1.NewTime(created.Add(timeSec(sec)))
	return b
}
func (b *ClaimBuilder) Config(fields map[string]any) *ClaimBuilder {
	body := map[string]any{"apiVersion": "fgpu.dev/v1alpha1", "kind": "GpuConfig"}
	for k, v := range fields {
		body[k] = v
	}
	raw, _ := json.Marshal(body)
	b.c.Spec.Devices.Config = append(b.c.Spec.Devices.Config, resourceapi.DeviceClaimConfiguration{
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: driver, Parameters: runtime.RawExtension{Raw: raw}}}})
	return b
}

// AllocatedBy pre-allocates the claim as kube-scheduler would (no allocator markers).
func (b *ClaimBuilder) AllocatedOn(node, dev, mem string) *ClaimBuilder {
	sid := types.UID("00000000-0000-0000-0000-" + fmt.Sprintf("%012d", len(b.c.Name)*7919))
	b.c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpu", Driver: driver, Pool: node, Device: dev, ShareID: &sid,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem), api.CapacityCompute: resource.MustParse("0")},
	}}}, NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}
	return b
}
func (b *ClaimBuilder) Obj() *resourceapi.ResourceClaim { return b.c }

// PodBuilder: MakePod("ns", "p").Claim("c").Obj().
type PodBuilder struct{ p *corev1.Pod }

func MakePod(ns, name string) *PodBuilder {
	return &PodBuilder{&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("pod-" + ns + "-" + name), Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("100m")}}}}}}}
}
func (b *PodBuilder) Claim(name string) *PodBuilder {
	b.p.Spec.ResourceClaims = append(b.p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: name, ResourceClaimName: ptr.To(name)})
	return b
}
func (b *PodBuilder) CPU(q string) *PodBuilder {
	b.p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse(q)
	return b
}
func (b *PodBuilder) Label(k, v string) *PodBuilder { b.p.Labels[k] = v; return b }
func (b *PodBuilder) NodeSelector(k, v string) *PodBuilder {
	if b.p.Spec.NodeSelector == nil {
		b.p.Spec.NodeSelector = map[string]string{}
	}
	b.p.Spec.NodeSelector[k] = v
	return b
}
func (b *PodBuilder) Bound(node string) *PodBuilder { b.p.Spec.NodeName = node; return b }
func (b *PodBuilder) Obj() *corev1.Pod              { return b.p }

// PolicyBuilder: MakePolicy("p").Isolation(api.IsolationNone).Obj().
type PolicyBuilder struct{ p *api.SharingPolicy }

func MakePolicy(name string) *PolicyBuilder {
	return &PolicyBuilder{&api.SharingPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}}}
}
func (b *PolicyBuilder) Isolation(i api.Isolation) *PolicyBuilder { b.p.Spec.Isolation = i; return b }
func (b *PolicyBuilder) AllowShared() *PolicyBuilder              { b.p.Spec.AllowSharedGPU = true; return b }
func (b *PolicyBuilder) Latency(l api.LatencyClass) *PolicyBuilder {
	b.p.Spec.LatencyClass = l
	return b
}
func (b *PolicyBuilder) MaxCo(n int32) *PolicyBuilder      { b.p.Spec.MaxCoTenants = &n; return b }
func (b *PolicyBuilder) MaxTenants(n int32) *PolicyBuilder { b.p.Spec.MaxTenantsPerGPU = &n; return b }
func (b *PolicyBuilder) Mode(m api.PolicyMode) *PolicyBuilder {
	b.p.Spec.Mode = m
	return b
}
func (b *PolicyBuilder) ComputeFromMemory() *PolicyBuilder {
	b.p.Spec.ComputeFromMemory = true
	return b
}
func (b *PolicyBuilder) Priority(p int32) *PolicyBuilder { b.p.Spec.Priority = p; return b }
func (b *PolicyBuilder) Pods(k, v string) *PolicyBuilder {
	b.p.Spec.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	return b
}
func (b *PolicyBuilder) Namespaces(k, v string) *PolicyBuilder {
	b.p.Spec.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{k: v}}
	return b
}
func (b *PolicyBuilder) QuotaMemory(q string) *PolicyBuilder {
	if b.p.Spec.Quota == nil {
		b.p.Spec.Quota = &api.Quota{}
	}
	m := resource.MustParse(q)
	b.p.Spec.Quota.Memory = &m
	return b
}
func (b *PolicyBuilder) Obj() *api.SharingPolicy { return b.p }
