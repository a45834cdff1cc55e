// Package v1alpha1 holds fgpu's versioned API: the opaque device configuration a ResourceClaim
// (or the allocator) hands to the kubelet plugin, and the sharing policies.
//
// +groupName=fgpu.dev
package v1alpha1
