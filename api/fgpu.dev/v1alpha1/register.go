package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of fgpu's types, also the suffix of the DRA driver name.
const GroupName = "fgpu.dev"

// SchemeGroupVersion is this package's group and version.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

var (
	// SchemeBuilder collects what registers fgpu's API objects in a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds SharingPolicy and SharingPolicyList to a scheme (the generated
	// clientset's among them).
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource qualifies a resource of this group (the generated listers' not-found errors).
func Resource(resource string) schema.GroupResource {
	return SchemeGroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &SharingPolicy{}, &SharingPolicyList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
