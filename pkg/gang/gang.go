// Package gang finds the pods that run as one job (a gang: the workers of a distributed
// training job) and the node labels that keep its pods close to each other, so that the
// allocator places a gang's next pod where its other pods already are: the same rack or
// block, not across the data centre. It is a preference: what a pod requires (its node
// selector and affinity, which Kueue's topology-aware scheduling writes) always wins.
package gang

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
)

// The names that make pods one gang, most specific first. A gang never spans namespaces:
// what a tenant writes on its pods moves only its own pods.
const (
	// LabelPodGroup is the coscheduling plugin's PodGroup (scheduler-plugins).
	LabelPodGroup = "scheduling.x-k8s.io/pod-group"
	// LabelKueuePodGroup is Kueue's group of plain pods admitted as one workload.
	LabelKueuePodGroup = "kueue.x-k8s.io/pod-group-name"
	// LabelJobSet is the JobSet a pod's Job belongs to.
	LabelJobSet = "jobset.sigs.k8s.io/jobset-name"
)

// IndexName is the pod index by gang (Index).
const IndexName = "fgpu.dev/gang"

// Of is the gang pod p belongs to, "namespace/kind/name", or "" when it belongs to none.
func Of(p *corev1.Pod) string {
	kind, name := "", ""
	switch {
	case p.Spec.SchedulingGroup != nil && p.Spec.SchedulingGroup.PodGroupName != nil:
		kind, name = "podgroup", *p.Spec.SchedulingGroup.PodGroupName
	case p.Labels[LabelPodGroup] != "":
		kind, name = "pod-group", p.Labels[LabelPodGroup]
	case p.Labels[LabelKueuePodGroup] != "":
		kind, name = "kueue-pod-group", p.Labels[LabelKueuePodGroup]
	case p.Labels[LabelJobSet] != "":
		kind, name = "jobset", p.Labels[LabelJobSet]
	default:
		// A plain Job's pods, Indexed or not, are often independent (batch inference):
		// they are placed as any pod is.
		return ""
	}
	return p.Namespace + "/" + kind + "/" + name
}

// Index indexes pods by gang, for a pod informer.
func Index(obj any) ([]string, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		if g := Of(p); g != "" {
			return []string{g}, nil
		}
	}
	return nil, nil
}

// Level is a node label value that a gang's next pod should share with the others.
type Level struct{ Key, Value string }

// Levels are where a gang's next pod should go, nearest first: for each topology key
// (node labels, nearest first: accelerator domain, block, spine, zone), the value most of
// the nodes of the gang's placed pods have; ties go to the smaller value. Nodes without the
// label do not vote; a key none of them has is left out.
func Levels(keys []string, members []*corev1.Node) []Level {
	var out []Level
	for _, k := range keys {
		votes := map[string]int{}
		for _, n := range members {
			if v, ok := n.Labels[k]; ok && v != "" {
				votes[v]++
			}
		}
		best, bestN := "", 0
		for v, n := range votes {
			if n > bestN || (n == bestN && v < best) {
				best, bestN = v, n
			}
		}
		if bestN > 0 {
			out = append(out, Level{Key: k, Value: best})
		}
	}
	return out
}

// DefaultTopologyKeys are the node labels the allocator keeps a gang close by when none
// are configured: topograph's (NVIDIA's tool that labels nodes with the network's
// topology) and the zone. Operators with Kueue's topology-aware scheduling set the
// levels of their Topology object instead.
var DefaultTopologyKeys = []string{
	"network.topology.nvidia.com/accelerator",
	"network.topology.nvidia.com/block",
	"network.topology.nvidia.com/spine",
	"topology.kubernetes.io/zone",
}

// Members are the running or pending pods of gang g in the index pods, without those in
// skip: a finished or deleted pod holds no place the gang should stay near.
func Members(byGang interface {
	ByIndex(name, value string) ([]any, error)
}, g string, skip []*corev1.Pod) []*corev1.Pod {
	objs, _ := byGang.ByIndex(IndexName, g)
	out := make([]*corev1.Pod, 0, len(objs))
	for _, o := range objs {
		p, ok := o.(*corev1.Pod)
		if !ok || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed ||
			slices.ContainsFunc(skip, func(s *corev1.Pod) bool { return s.UID == p.UID }) {
			continue
		}
		out = append(out, p)
	}
	return out
}
