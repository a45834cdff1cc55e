package controller

import (
	"context"
	"errors"
	"io"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	fgpuinformers "github.com/fgpu-dev/fgpu/pkg/client/informers/externalversions"
	fgpulisters "github.com/fgpu-dev/fgpu/pkg/client/listers/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gang"
)

// listers are the informer caches the controller reads.
type listers struct {
	claims     resourcelisters.ResourceClaimLister
	classes    resourcelisters.DeviceClassLister
	nodes      corelisters.NodeLister
	pods       corelisters.PodLister
	namespaces corelisters.NamespaceLister
	// deployments and statefulsets hold no pod template (stripped): idle scale-down reads
	// their replicas and annotations only.
	deployments  appslisters.DeploymentLister
	statefulsets appslisters.StatefulSetLister
	// policies is nil when the controller has no fgpu client: every claim then gets the
	// default policy.
	policies fgpulisters.SharingPolicyLister
	// podsByClaim indexes pods by the claims they name ("namespace/claim").
	podsByClaim cache.Indexer
	// slicesByNode indexes ResourceSlices by node (or pool).
	slicesByNode cache.Indexer
	// podsByGang indexes pods by the gang they belong to (gang.Of).
	podsByGang cache.Indexer
	// observed lists the observed-usage ConfigMaps of the allocator's namespace; nil
	// without one.
	observed corelisters.ConfigMapLister
}

// informerSet is the controller's informers: the factories that start them, their caches,
// and whether they have synced.
type informerSet struct {
	listers
	factory     informers.SharedInformerFactory
	fgpuFactory fgpuinformers.SharedInformerFactory
	// observedFactory watches the observed-usage ConfigMaps of the allocator's namespace.
	observedFactory informers.SharedInformerFactory
	hasSynced       []cache.InformerSynced
}

// eventHandlers are the controller's reactions to each kind of object.
type eventHandlers struct {
	claim, slice, node, pod, policy cache.ResourceEventHandler
	observed                        cache.ResourceEventHandler // observed-usage ConfigMaps
	workload                        cache.ResourceEventHandler // Deployments and StatefulSets
	other                           cache.ResourceEventHandler // classes and namespaces
}

const indexByKey = "key"

func newInformerSet(client kubernetes.Interface, fgpuClient versioned.Interface, h eventHandlers, namespace string) *informerSet {
	// The allocator never reads managed fields: dropping them halves what the caches hold.
	strip := func(obj any) (any, error) {
		if a, ok := obj.(metav1.ObjectMetaAccessor); ok {
			a.GetObjectMeta().SetManagedFields(nil)
		}
		switch w := obj.(type) {
		case *appsv1.Deployment:
			w.Spec.Template = corev1.PodTemplateSpec{}
		case *appsv1.StatefulSet:
			w.Spec.Template, w.Spec.VolumeClaimTemplates = corev1.PodTemplateSpec{}, nil
		}
		return obj, nil
	}
	s := &informerSet{factory: informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTransform(strip))}
	claimInf := s.factory.Resource().V1().ResourceClaims()
	sliceInf := s.factory.Resource().V1().ResourceSlices()
	classInf := s.factory.Resource().V1().DeviceClasses()
	nodeInf := s.factory.Core().V1().Nodes()
	podInf := s.factory.Core().V1().Pods()
	nsInf := s.factory.Core().V1().Namespaces()
	depInf := s.factory.Apps().V1().Deployments()
	stsInf := s.factory.Apps().V1().StatefulSets()
	s.deployments, s.statefulsets = depInf.Lister(), stsInf.Lister()
	s.claims, s.classes, s.nodes, s.pods, s.namespaces = claimInf.Lister(), classInf.Lister(), nodeInf.Lister(), podInf.Lister(), nsInf.Lister()
	_ = podInf.Informer().AddIndexers(cache.Indexers{indexByKey: func(obj any) ([]string, error) {
		p, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		names := podClaimNames(p)
		out := make([]string, len(names))
		for i, n := range names {
			out[i] = claimKeyIn(p.Namespace, n)
		}
		return out, nil
	}})
	_ = podInf.Informer().AddIndexers(cache.Indexers{gang.IndexName: gang.Index})
	s.podsByClaim, s.podsByGang = podInf.Informer().GetIndexer(), podInf.Informer().GetIndexer()
	_ = sliceInf.Informer().AddIndexers(cache.Indexers{indexByKey: func(obj any) ([]string, error) {
		if sl, ok := obj.(*resourceapi.ResourceSlice); ok {
			return []string{sliceNode(sl)}, nil
		}
		return nil, nil
	}})
	s.slicesByNode = sliceInf.Informer().GetIndexer()

	for _, ih := range []struct {
		inf cache.SharedIndexInformer
		h   cache.ResourceEventHandler
	}{{claimInf.Informer(), h.claim}, {sliceInf.Informer(), h.slice}, {classInf.Informer(), h.other},
		{nodeInf.Informer(), h.node}, {podInf.Informer(), h.pod}, {nsInf.Informer(), h.other},
		{depInf.Informer(), h.workload}, {stsInf.Informer(), h.workload}} {
		// Synced once the handler has seen every listed object, not only once the
		// cache holds them: the first decisions must see the model of every node.
		reg, _ := ih.inf.AddEventHandler(ih.h)
		s.hasSynced = append(s.hasSynced, reg.HasSynced)
	}
	if namespace != "" {
		// Placements do not wait for it: observed use only feeds recommendations.
		s.observedFactory = informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = api.LabelObservedUsage }))
		cmInf := s.observedFactory.Core().V1().ConfigMaps()
		_, _ = cmInf.Informer().AddEventHandler(h.observed)
		s.observed = cmInf.Lister()
	}
	if fgpuClient != nil {
		s.fgpuFactory = fgpuinformers.NewSharedInformerFactory(fgpuClient, 0)
		pInf := s.fgpuFactory.Fgpu().V1alpha1().SharingPolicies()
		s.policies = pInf.Lister()
		// A policy that does not decode fails the whole list: say what that means for
		// placements, where the reflector alone would only log a decoding error.
		_ = pInf.Informer().SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			if !errors.Is(err, io.EOF) && !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
				klog.FromContext(ctx).Error(err, "Cannot read the SharingPolicies: until they can be read, no claim is placed at startup, and a running allocator keeps the policies it last read")
			}
			cache.DefaultWatchErrorHandler(ctx, r, err)
		})
		reg, _ := pInf.Informer().AddEventHandler(h.policy)
		s.hasSynced = append(s.hasSynced, reg.HasSynced)
	}
	return s
}

func (s *informerSet) start(ctx context.Context) {
	s.factory.Start(ctx.Done())
	if s.fgpuFactory != nil {
		s.fgpuFactory.Start(ctx.Done())
	}
}

// startObserved starts the observed-usage ConfigMaps' informer (none without a namespace).
func (s *informerSet) startObserved(ctx context.Context) {
	if s.observedFactory != nil {
		s.observedFactory.Start(ctx.Done())
	}
}

func (s *informerSet) synced() bool {
	for _, f := range s.hasSynced {
		if !f() {
			return false
		}
	}
	return true
}

// handlerFuncs adapts typed reactions to an informer's untyped events; a deleted object
// whose final state is unknown is unwrapped, and objects of other types are ignored.
func handlerFuncs[T any](add func(T), update func(old, cur T), del func(T)) cache.ResourceEventHandlerFuncs {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if v, ok := o.(T); ok && add != nil {
				add(v)
			}
		},
		UpdateFunc: func(o, n any) {
			ov, ok1 := o.(T)
			nv, ok2 := n.(T)
			if ok1 && ok2 && update != nil {
				update(ov, nv)
			}
		},
		DeleteFunc: func(o any) {
			if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = t.Obj
			}
			if v, ok := o.(T); ok && del != nil {
				del(v)
			}
		},
	}
}

func sliceNode(s *resourceapi.ResourceSlice) string {
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		return *s.Spec.NodeName
	}
	return s.Spec.Pool.Name
}
