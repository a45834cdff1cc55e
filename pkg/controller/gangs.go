package controller

import (
	corev1 "k8s.io/api/core/v1"

	"github.com/fgpu-dev/fgpu/pkg/gang"
)

// maxGangMembers bounds the nodes of a gang's other pods that one claim's placement looks
// at (and four times as many pods are looked at for them): a tenant's gang of thousands of
// pods must not make each of its decisions cost as much.
const maxGangMembers = 64

// gangLevels are the node labels a claim's pods should share with the other pods of their
// gang (pkg/gang), nearest first; none when the pods belong to no gang or none of its
// other pods has a node yet. A member's node is the one it is bound to, or the one the
// allocator put its claims on while it waits to be bound.
func gangLevels(l *listers, keys []string, driver string, consumers []*corev1.Pod) []gang.Level {
	if len(keys) == 0 || len(consumers) == 0 {
		return nil
	}
	g := gang.Of(consumers[0])
	if g == "" {
		return nil
	}
	var nodes []*corev1.Node
	for i, p := range gang.Members(l.podsByGang, g, consumers) {
		if i == 4*maxGangMembers {
			break
		}
		name := p.Spec.NodeName
		if name == "" {
			name = l.allocatedNode(p, driver)
		}
		if name == "" {
			continue
		}
		if n, err := l.nodes.Get(name); err == nil {
			nodes = append(nodes, n)
		}
		if len(nodes) == maxGangMembers {
			break
		}
	}
	return gang.Levels(keys, nodes)
}

// allocatedNode is the node of a pod's first claim that the driver's devices are allocated
// on ("" for none): the allocator's pools are nodes.
func (l *listers) allocatedNode(p *corev1.Pod, driver string) string {
	for _, name := range podClaimNames(p) {
		c, err := l.claims.ResourceClaims(p.Namespace).Get(name)
		if err != nil || c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver == driver {
				return r.Pool
			}
		}
	}
	return ""
}
