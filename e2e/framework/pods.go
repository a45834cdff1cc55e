package framework

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// Image is the project's image; fgpu-probe is the workload.
const Image = "fgpu.dev/fgpu:dev"

// GPUPod builds a pod whose ResourceClaimTemplate asks for a GPU share:
// MakeGPUPod(ns, "a").Memory("10Gi").Compute(20).Obj().
type GPUPod struct {
	ns, name string
	class    string
	count    int64
	capacity map[resourceapi.QualifiedName]resource.Quantity
	config   map[string]any
	labels   map[string]string
	cpu      string
	selector string
	cons     []resourceapi.DeviceConstraint
}

// MakeGPUPod starts a GPU pod of the share class.
func MakeGPUPod(ns, name string) *GPUPod {
	return &GPUPod{ns: ns, name: name, class: api.DeviceClassShared, capacity: map[resourceapi.QualifiedName]resource.Quantity{}}
}

// Memory asks for device memory.
func (p *GPUPod) Memory(q string) *GPUPod {
	p.capacity[api.CapacityMemory] = resource.MustParse(q)
	return p
}

// Compute asks for a percent of the GPU's SMs.
func (p *GPUPod) Compute(pct int) *GPUPod {
	p.capacity[api.CapacityCompute] = *resource.NewQuantity(int64(pct), resource.DecimalSI)
	return p
}

// Count asks for n devices of the class (allocation mode ExactCount).
func (p *GPUPod) Count(n int64) *GPUPod { p.count = n; return p }

// Class sets the DeviceClass.
func (p *GPUPod) Class(c string) *GPUPod { p.class = c; return p }

// Config adds an opaque GpuConfig with these fields.
func (p *GPUPod) Config(fields map[string]any) *GPUPod { p.config = fields; return p }

// Label sets a pod label.
func (p *GPUPod) Label(k, v string) *GPUPod {
	if p.labels == nil {
		p.labels = map[string]string{}
	}
	p.labels[k] = v
	return p
}

// Selector adds a CEL selector to the request.
func (p *GPUPod) Selector(expr string) *GPUPod { p.selector = expr; return p }

// Constraint adds a device constraint to the claim.
func (p *GPUPod) Constraint(c resourceapi.DeviceConstraint) *GPUPod {
	p.cons = append(p.cons, c)
	return p
}

// CPU sets the container's CPU request.
func (p *GPUPod) CPU(q string) *GPUPod { p.cpu = q; return p }

// Template is the pod's ResourceClaimTemplate.
func (p *GPUPod) Template() *resourceapi.ResourceClaimTemplate {
	req := resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: p.class}}
	if len(p.capacity) > 0 {
		req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: p.capacity}
	}
	if p.count > 0 {
		req.Exactly.AllocationMode, req.Exactly.Count = resourceapi.DeviceAllocationModeExactCount, p.count
	}
	if p.selector != "" {
		req.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: p.selector}}}
	}
	spec := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}, Constraints: p.cons}}
	if p.config != nil {
		body := map[string]any{"apiVersion": api.SchemeGroupVersion.String(), "kind": api.GpuConfigKind}
		for k, v := range p.config {
			body[k] = v
		}
		raw, _ := json.Marshal(body)
		spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: Driver, Parameters: runtime.RawExtension{Raw: raw}},
		}}}
	}
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}
}

// Pod is the pod, running fgpu-probe with the template's claim.
func (p *GPUPod) Pod() *corev1.Pod {
	c := corev1.Container{
		Name: "probe", Image: Image, ImagePullPolicy: corev1.PullNever,
		Command:   []string{"/usr/bin/fgpu-probe"},
		Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
	}
	if p.cpu != "" {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(p.cpu)}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: p.ns, Name: p.name, Labels: p.labels},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers:                    []corev1.Container{c},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(p.name)}},
		},
	}
}

// Create creates the template and the pod.
func (c *Cluster) Create(ctx context.Context, p *GPUPod) (*corev1.Pod, error) {
	return p.CreateAs(ctx, c.Client)
}

// WaitRunning waits for the pod to run and returns it.
func (c *Cluster) WaitRunning(ctx context.Context, ns, name string, timeout time.Duration) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		pod, err = c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		return pod, fmt.Errorf("pod %s/%s not running after %s (phase %s): %w", ns, name, timeout, phase(pod), err)
	}
	return pod, nil
}

func phase(p *corev1.Pod) corev1.PodPhase {
	if p == nil {
		return "unknown"
	}
	return p.Status.Phase
}

// WaitEvent waits for an event about the object whose message contains substr.
func (c *Cluster) WaitEvent(ctx context.Context, ns, objectName, substr string, timeout time.Duration) (string, error) {
	var found string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + objectName})
		if err != nil {
			return false, nil
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, substr) {
				found = e.Reason + ": " + e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("no event on %s/%s containing %q within %s", ns, objectName, substr, timeout)
	}
	return found, nil
}

// ProbeReport is what fgpu-probe printed in a pod.
type ProbeReport struct {
	Env             map[string]string `json:"env"`
	Devices         []string          `json:"devices"`
	Mounts          []string          `json:"mounts"`
	PipeDirWritable bool              `json:"pipeDirWritable"`
	// DriverFiles are the paths where a CUDA image expects the driver that exist in the container.
	DriverFiles []string `json:"driverFiles"`
	// ShmFile is a file the probe wrote in its /dev/shm.
	ShmFile string `json:"shmFile"`
}

// Probe reads fgpu-probe's JSON line from the pod's log.
func (c *Cluster) Probe(ctx context.Context, ns, name string) (ProbeReport, error) {
	var r ProbeReport
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		raw, err := c.Client.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		sc := bufio.NewScanner(strings.NewReader(string(raw)))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			if line, ok := strings.CutPrefix(sc.Text(), "FGPU-PROBE "); ok {
				return true, json.Unmarshal([]byte(line), &r)
			}
		}
		return false, nil
	})
	return r, err
}

// ClaimOf returns the pod's generated ResourceClaim.
func (c *Cluster) ClaimOf(ctx context.Context, pod *corev1.Pod) (*resourceapi.ResourceClaim, error) {
	var claim *resourceapi.ResourceClaim
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil || len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			return false, nil
		}
		claim, err = c.Client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		return err == nil, nil
	})
	return claim, err
}
