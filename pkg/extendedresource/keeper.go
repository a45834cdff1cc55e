// Package extendedresource serves pods written for NVIDIA's device plugin. The chart's
// admission policy fgpu-extended-resource-pods rewrites a container's request for N of an
// extended resource (nvidia.com/gpu) into a claim from the ResourceClaimTemplate
// fgpu-gpu-N in the pod's namespace; the TemplateKeeper makes sure that template is there.
// The claims are then fgpu's like any other: the allocator places them and sizing sizes them.
package extendedresource

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// ReasonTemplateFailed is the pod event when its template cannot be made.
const ReasonTemplateFailed = "FgpuTemplateFailed"

// TemplateKeeper makes the templates that rewritten pods name, in their namespaces, and
// makes one again when it is deleted while a pod still needs it. It watches only what
// carries api.LabelExtendedResource: the rewritten pods and its own templates.
type TemplateKeeper struct {
	client    kubernetes.Interface
	recorder  record.EventRecorder
	resource  string
	class     string
	factory   informers.SharedInformerFactory
	pods      corelisters.PodLister
	templates resourcelisters.ResourceClaimTemplateLister
	synced    []cache.InformerSynced
	queue     workqueue.TypedRateLimitingInterface[cache.ObjectName]
}

// NewTemplateKeeper keeps templates whose one request asks for whole GPUs of deviceClass, for
// pods whose requests for resource (nvidia.com/gpu) the admission policy rewrote.
func NewTemplateKeeper(client kubernetes.Interface, recorder record.EventRecorder, resource, deviceClass string) *TemplateKeeper {
	marked := labels.SelectorFromSet(labels.Set{api.LabelExtendedResource: "true"}).String()
	k := &TemplateKeeper{
		client:   client,
		recorder: recorder,
		resource: resource,
		class:    deviceClass,
		factory: informers.NewSharedInformerFactoryWithOptions(client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = marked })),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[cache.ObjectName](100*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "fgpu-extended-resource-templates"}),
	}
	podInf := k.factory.Core().V1().Pods()
	tmplInf := k.factory.Resource().V1().ResourceClaimTemplates()
	k.pods, k.templates = podInf.Lister(), tmplInf.Lister()
	k.synced = []cache.InformerSynced{podInf.Informer().HasSynced, tmplInf.Informer().HasSynced}
	_, _ = podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    k.podChanged,
		UpdateFunc: func(_, obj any) { k.podChanged(obj) },
	})
	_, _ = tmplInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if t, ok := obj.(*resourceapi.ResourceClaimTemplate); ok {
				k.queue.Add(cache.MetaObjectToName(t))
			}
		},
	})
	return k
}

// Run keeps templates until ctx ends.
func (k *TemplateKeeper) Run(ctx context.Context) error {
	defer k.queue.ShutDown()
	k.factory.Start(ctx.Done())
	defer k.factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), k.synced...) {
		return fmt.Errorf("extended-resource template caches did not sync")
	}
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		for k.next(ctx) {
		}
	}, time.Second)
	<-ctx.Done()
	return nil
}

func (k *TemplateKeeper) next(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		klog.FromContext(ctx).Error(err, "Keeping an extended-resource template", "template", key)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

// podChanged queues the templates whose claims a pod still waits for.
func (k *TemplateKeeper) podChanged(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil {
			continue
		}
		if _, ok := TemplateCount(*rc.ResourceClaimTemplateName); ok && needs(pod, *rc.ResourceClaimTemplateName) {
			k.queue.Add(cache.ObjectName{Namespace: pod.Namespace, Name: *rc.ResourceClaimTemplateName})
		}
	}
}

// needs: the pod names the template for a claim kube-controller-manager has not made yet.
func needs(pod *corev1.Pod, template string) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil || *rc.ResourceClaimTemplateName != template {
			continue
		}
		if !slices.ContainsFunc(pod.Status.ResourceClaimStatuses, func(s corev1.PodResourceClaimStatus) bool { return s.Name == rc.Name }) {
			return true
		}
	}
	return false
}

func (k *TemplateKeeper) sync(ctx context.Context, key cache.ObjectName) error {
	if _, err := k.templates.ResourceClaimTemplates(key.Namespace).Get(key.Name); err == nil {
		return nil
	}
	count, _ := TemplateCount(key.Name)
	pods, err := k.pods.Pods(key.Namespace).List(labels.Everything())
	if err != nil {
		return err
	}
	var needing []*corev1.Pod
	for _, p := range pods {
		if needs(p, key.Name) {
			needing = append(needing, p)
		}
	}
	if len(needing) == 0 {
		return nil
	}
	_, err = k.client.ResourceV1().ResourceClaimTemplates(key.Namespace).Create(ctx, Template(key.Namespace, count, k.class), metav1.CreateOptions{})
	switch {
	case err == nil:
		klog.FromContext(ctx).V(2).Info("Made an extended-resource template", "template", key, "gpus", count)
		return nil
	case apierrors.IsAlreadyExists(err):
		// Someone else's template of that name (the namespace's own): its pods use it.
		return nil
	}
	for _, p := range needing {
		k.recorder.Eventf(p, corev1.EventTypeWarning, ReasonTemplateFailed,
			"fgpu could not make the ResourceClaimTemplate %s that this pod's %s request was rewritten to use: %v", key.Name, k.resource, err)
	}
	return err
}

// TemplateCount is the number of GPUs a template of the admission policy's name asks for.
func TemplateCount(name string) (int, bool) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, api.ExtendedResourceTemplatePrefix))
	if !strings.HasPrefix(name, api.ExtendedResourceTemplatePrefix) || err != nil ||
		n < 1 || n > api.ExtendedResourceMaxGPUs || name != api.ExtendedResourceTemplatePrefix+strconv.Itoa(n) {
		return 0, false
	}
	return n, true
}

// Template asks for count whole GPUs of deviceClass: a request that names no capacity gets
// all of a GPU's memory, as a device plugin's GPU is the whole GPU.
func Template(namespace string, count int, deviceClass string) *resourceapi.ResourceClaimTemplate {
	return &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: namespace,
			Name:      api.ExtendedResourceTemplatePrefix + strconv.Itoa(count),
			Labels:    map[string]string{api.LabelExtendedResource: "true"},
		},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests: []resourceapi.DeviceRequest{{
				Name: api.ExtendedResourceRequest,
				Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: deviceClass,
					AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
					Count:           int64(count),
				},
			}},
		}}},
	}
}
