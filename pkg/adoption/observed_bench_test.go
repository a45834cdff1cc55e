package adoption

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkObservedShares is the allocator's count of the GPU pods fgpu did not place (every
// minute, over every pod in its cache) at 1,000 nodes of 8 GPUs: 50,000 pods, 8,000 of them
// asking for nvidia.com/gpu on nodes whose device plugin does not share GPUs.
func BenchmarkObservedShares(b *testing.B) {
	const nodes, pods, asking = 1000, 50000, 8000
	var gpus []*GPU
	for n := range nodes {
		for g := range 8 {
			gpus = append(gpus, &GPU{Node: fmt.Sprintf("node-%05d", n), Device: fmt.Sprintf("gpu-%d", g), Product: "H100", Memory: 80 << 30})
		}
	}
	o := Outside{FgpuNamespace: "fgpu-system", Node: func(name string) (*corev1.Node, error) {
		return &corev1.Node{Status: corev1.NodeStatus{Allocatable: corev1.ResourceList{DefaultExtendedResource: resource.MustParse("8")}}}, nil
	}}
	for i := range pods {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%d", i%50), Name: fmt.Sprintf("p-%d", i), UID: types.UID(fmt.Sprint(i))},
			Spec: corev1.PodSpec{NodeName: fmt.Sprintf("node-%05d", i%nodes), Containers: []corev1.Container{{}}}}
		if i < asking {
			p.Spec.Containers[0].Resources.Limits = corev1.ResourceList{DefaultExtendedResource: resource.MustParse("1")}
		}
		o.Pods = append(o.Pods, p)
	}
	from := time.Now().Add(-Window)
	for b.Loop() {
		if v := ObservedShares(o, gpus, from); len(v.Shares) != asking {
			b.Fatalf("%d shares, want %d", len(v.Shares), asking)
		}
	}
}
