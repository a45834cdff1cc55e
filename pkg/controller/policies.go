package controller

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// policies lists the SharingPolicies (none without an fgpu client).
func (l *listers) policyList() []*api.SharingPolicy {
	if l.policies == nil {
		return nil
	}
	list, err := l.policies.List(labels.Everything())
	if err != nil {
		return nil
	}
	return list
}

// policyOf is the policy that applies to a claim used by pod, as placing it resolves it.
func (l *listers) policyOf(namespace string, pod *corev1.Pod) policy.Effective {
	nsLabels := map[string]string{}
	if ns, err := l.namespaces.Get(namespace); err == nil && ns.Labels != nil {
		nsLabels = ns.Labels
	}
	podLabels := pod.Labels
	if podLabels == nil {
		podLabels = map[string]string{}
	}
	return policy.Resolve(l.policyList(), nsLabels, podLabels)
}
