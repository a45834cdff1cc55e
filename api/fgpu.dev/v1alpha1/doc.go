// Package v1alpha1 holds fgpu's versioned API: the opaque device configuration a ResourceClaim
// (or the allocator) hands to the kubelet plugin, and the sharing policies.
//
// +groupName=fgpu.dev
package v1alpha1

import "k8s.io/apimachinery/pkg/runtime/schema"

// GroupName is the API group of fgpu's types, also the suffix of the DRA driver name.
const GroupName = "fgpu.dev"

// SchemeGroupVersion is this package's group and version.
var SchemeGroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}
