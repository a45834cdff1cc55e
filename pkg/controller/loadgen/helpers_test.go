package loadgen

import (
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func deviceClass(name string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.fgpu.dev"`}}}}}
}

func metav1CreateOptions() metav1.CreateOptions { return metav1.CreateOptions{} }
