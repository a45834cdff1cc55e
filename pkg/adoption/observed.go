package adoption

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
)

// DefaultExtendedResource is the resource NVIDIA's device plugin serves whole GPUs (or their
// time-sliced replicas) as, and the chart's extendedResource.name by default.
const DefaultExtendedResource = "nvidia.com/gpu"

// The GPU pods fgpu did not place (observe mode). What such a pod holds is taken from what it
// asks the scheduler for: its containers' limits of the extended resource (nvidia.com/gpu),
// which the device plugin hands out, not from what it was seen using. So a pod that holds a
// GPU but ran nothing on it in the window (an idle notebook) is counted, and pods that
// time-slice one GPU count it once. The kubelet plugins' ConfigMaps say what each pod used,
// and on which GPUs: those GPUs are the ones it holds.
//
// Per node, the GPUs are those fgpu's ResourceSlices publish there (physical GPUs: the
// plugin publishes each once). Where the node's allocatable count of the resource exceeds
// them, the device plugin shares its GPUs (time-slicing, MPS, MIG): each unit is 1/ρ of a
// GPU, ρ = allocatable / GPUs rounded up. A pod's units that no sample locates are then
// put, in name order, on the GPUs seen in use that have replicas to spare and then on as
// few other GPUs as they fit: the fewest GPUs the pods can hold, a lower bound, and
// Summary.GPUsHeldAtMost the upper bound beside it. A node fgpu does not publish has no known
// GPUs: its pods' units count as whole GPUs of unknown memory, as they are in the GPUs needed.

// NodeLookup reads a node: its allocatable count of the extended resource says whether the
// device plugin shares its GPUs.
type NodeLookup func(name string) (*corev1.Node, error)

// Outside is what the counting of the GPU pods fgpu did not place reads.
type Outside struct {
	// FgpuNamespace is fgpu's own (the chart's): its pods are never such pods, and the
	// observed-usage ConfigMaps of it alone count, as only the kubelet plugins write there.
	FgpuNamespace string
	// Namespace is the one namespace counted, "" for every namespace.
	Namespace string
	// Resource is what such pods ask NVIDIA's device plugin for; "": DefaultExtendedResource.
	Resource corev1.ResourceName
	// Pods are the pods to look through (those of Namespace, or more).
	Pods []*corev1.Pod
	// Maps are the kubelet plugins' observed-usage ConfigMaps (observe mode); MapsErr says
	// why they could not be read, nil where they were (or observe mode is not read).
	Maps    []*corev1.ConfigMap
	MapsErr error
	// Node reads a node, to know whether its device plugin shares GPUs.
	Node NodeLookup
}

// Observed is what ObservedShares found: the shares, what a reader should be told about
// them, and how many more GPUs they may hold than counted (Slack: time-sliced replicas no
// sample locates).
type Observed struct {
	Shares []Share
	Notes  []string
	Slack  int
}

// observedPod is one pod fgpu did not place on a node: what it asks for and where it was seen.
type observedPod struct {
	pod   *corev1.Pod
	units int64
	seen  []*GPU // the published GPUs its processes were seen on
	use   *api.ShareUsage
	gpus  []*GPU // seen, then those its other units are counted on
}

// ObservedShares lists the GPU pods fgpu did not place in o.Namespace: each pod bound to a
// node and not finished that asks for o.Resource, or that the kubelet plugins saw using a GPU
// (observe mode's ConfigMaps), is a share of the GPUs it holds, among gpus (every published
// GPU, in name order), with its use where measured since from. A ConfigMap's entry counts
// only for the pod still running on that node under the UID measured. fgpu's own pods and
// the pods its admission policy rewrote (their resource is gone from their containers: they
// hold claims) are not such pods.
func ObservedShares(o Outside, gpus []*GPU, from time.Time) Observed {
	var v Observed
	resource := o.Resource
	if resource == "" {
		resource = DefaultExtendedResource
	}
	if o.MapsErr != nil {
		v.Notes = append(v.Notes, fmt.Sprintf("what GPU pods fgpu did not place used is not known (%v): they are counted from their %s alone", o.MapsErr, resource))
	}
	byKey := make(map[string]*GPU, len(gpus))
	published := map[string][]*GPU{}
	for _, g := range gpus {
		byKey[g.Node+"/"+g.Device] = g
		published[g.Node] = append(published[g.Node], g)
	}
	byNode, unasked := candidates(o, resource, observedUse(o.Maps, o.FgpuNamespace), byKey, from)
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	sort.Strings(nodes)
	var unpublished []string
	unpublishedGPUs := 0
	for _, node := range nodes {
		own := published[node]
		if len(own) == 0 {
			unpublished = append(unpublished, node)
		}
		unpublishedGPUs += v.count(o.Node, node, byNode[node], own, resource)
	}
	if len(unpublished) > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("%s on %s that fgpu does not publish: counted whole, of unknown memory and sharing, "+
			"and as they are in the GPUs needed", plural(unpublishedGPUs, "GPU")+" asked for as "+string(resource), plural(len(unpublished), "node")+" ("+strings.Join(unpublished, ", ")+")"))
	}
	if len(unasked) > 0 {
		v.Notes = append(v.Notes, fmt.Sprintf("%s used GPUs without asking for %s (another resource, or NVIDIA_VISIBLE_DEVICES): "+
			"counted on the GPUs they were seen using (%s)", plural(len(unasked), "pod"), resource, strings.Join(unasked, ", ")))
	}
	return v
}

// candidates are the pods to count by node, in name order, with what they ask for and where
// they were seen; unasked names those seen on a GPU that ask for none.
func candidates(o Outside, resource corev1.ResourceName, seen map[string]seenPod, gpus map[string]*GPU, from time.Time) (byNode map[string][]*observedPod, unasked []string) {
	var found []*observedPod
	for _, p := range o.Pods {
		node := p.Spec.NodeName
		// A pod counts once a kubelet took it (hostIP, which only the kubelet writes): a tenant
		// may name any node in spec.nodeName, and such a pod would hold nothing.
		if (o.Namespace != "" && p.Namespace != o.Namespace) || p.Namespace == o.FgpuNamespace || node == "" || p.Status.HostIP == "" ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		op := &observedPod{pod: p, units: asked(p, resource)}
		if e, ok := seen[string(p.UID)]; ok && e.node == node {
			for _, og := range e.pod.GPUs {
				if g := gpus[node+"/"+og.Device]; g != nil {
					op.seen = appendOnce(op.seen, g)
					if !og.Usage.To.Before(from) {
						op.use = merged(op.use, &og.Usage)
					}
				}
			}
		}
		if op.units > 0 || len(op.seen) > 0 {
			found = append(found, op)
		}
	}
	// In name order: a node's units no sample locates are put on its GPUs in that order.
	sort.Slice(found, func(i, j int) bool {
		a, b := found[i].pod, found[j].pod
		return a.Namespace < b.Namespace || (a.Namespace == b.Namespace && a.Name < b.Name)
	})
	byNode = map[string][]*observedPod{}
	for _, op := range found {
		if op.units == 0 {
			unasked = append(unasked, op.pod.Namespace+"/"+op.pod.Name)
		}
		byNode[op.pod.Spec.NodeName] = append(byNode[op.pod.Spec.NodeName], op)
	}
	return byNode, unasked
}

// count makes the shares of a node's pods (ops), on the GPUs fgpu publishes there (own),
// and returns how many GPUs they hold where fgpu publishes none.
func (v *Observed) count(lookup NodeLookup, node string, ops []*observedPod, own []*GPU, resource corev1.ResourceName) (unpublished int) {
	tmpl := template(node, own)
	replicas := int64(1)
	if slices.ContainsFunc(ops, func(op *observedPod) bool { return op.units > 0 }) {
		var n *corev1.Node
		err := fmt.Errorf("no node to read")
		if lookup != nil {
			n, err = lookup(node)
		}
		switch {
		case err != nil && len(own) > 0:
			v.Notes = append(v.Notes, fmt.Sprintf("node %s could not be read (%v): its pods' %s is counted as whole GPUs; if the device plugin shares them "+
				"(time-slicing, MPS), fewer are held", node, err, resource))
		case err != nil:
		default:
			q, ok := n.Status.Allocatable[resource]
			a := q.Value()
			if ok && len(own) > 0 && a > int64(len(own)) {
				replicas = (a + int64(len(own)) - 1) / int64(len(own))
			}
			// The kubelet admits no more than the node offers; what a pod's spec asks beyond
			// that it does not hold.
			for _, op := range ops {
				if ok {
					op.units = min(op.units, max(a, 0))
				}
			}
		}
	}
	missing := 0
	if replicas == 1 {
		// Whole GPUs: a pod's units no sample locates are GPUs no other pod holds.
		for _, op := range ops {
			op.gpus = op.seen
			for range max(0, op.units-int64(len(op.seen))) {
				g := tmpl
				op.gpus = append(op.gpus, &g)
			}
		}
	} else {
		missing = v.fill(node, ops, own, tmpl, replicas, resource)
	}
	for _, op := range ops {
		if len(op.gpus) == 0 {
			continue
		}
		s := Share{Workload: api.WorkloadOf(op.pod, api.ExtendedResourceRequest), GPUs: op.gpus, Use: op.use, Observed: true,
			Whole: replicas == 1 || op.units == 0, Fixed: len(own) == 0, NoSamples: len(own) > 0 && op.use == nil}
		for _, g := range op.gpus {
			s.Held += g.Memory
		}
		s.Size = s.Held / int64(len(s.GPUs))
		if !s.Whole {
			s.TimeSliced, s.Estimated = true, missing > 0
			m := tmpl.Memory
			if m == 0 { // GPUs of different sizes: the one it was seen on
				m = s.GPUs[0].Memory
			}
			s.Size = m / replicas
		}
		if s.Fixed {
			unpublished += len(s.GPUs)
		}
		v.Shares = append(v.Shares, s)
	}
	return unpublished
}

// fill counts the pods of a node whose device plugin shares each GPU as replicas units: the
// GPUs a pod was seen on are its, and its units no sample locates go, in name order, on the
// spare replicas of the GPUs its namespace was seen on, then on any spare replica, then on as
// few other GPUs as they fit. It says so in a note,
// adds the GPUs they may hold beyond those to Slack, and returns the units not located.
func (v *Observed) fill(node string, ops []*observedPod, own []*GPU, tmpl GPU, replicas int64, resource corev1.ResourceName) int {
	taken := map[*GPU]int64{}
	for _, op := range ops {
		for _, g := range op.seen {
			taken[g]++
		}
	}
	identified := len(taken)
	seenBy := map[string]map[*GPU]bool{}
	for _, op := range ops {
		for _, g := range op.seen {
			if seenBy[op.pod.Namespace] == nil {
				seenBy[op.pod.Namespace] = map[*GPU]bool{}
			}
			seenBy[op.pod.Namespace][g] = true
		}
	}
	var extra []*GPU
	missing, pods := 0, 0
	left := make([]int64, len(ops))
	for i, op := range ops {
		op.gpus = op.seen
		left[i] = max(0, op.units-int64(len(op.seen)))
		if left[i] > 0 {
			pods++
			missing += int(left[i])
		}
	}
	// First each pod's units on the spare replicas of GPUs its own namespace was seen on, so
	// that another namespace's pods, earlier in name order, do not push its estimate up; then
	// what is left on any spare replica, then on as few other GPUs as it fits.
	for _, ownOnly := range []bool{true, false} {
		for i, op := range ops {
			for ; left[i] > 0; left[i]-- {
				var at *GPU
				for _, g := range own {
					if n, ok := taken[g]; ok && n < replicas && (!ownOnly || seenBy[op.pod.Namespace][g]) {
						at = g
						break
					}
				}
				if at == nil && ownOnly {
					break
				}
				if at == nil && (len(extra) == 0 || taken[extra[len(extra)-1]] >= replicas) {
					g := tmpl
					extra = append(extra, &g)
					taken[&g] = 0
				}
				if at == nil {
					at = extra[len(extra)-1]
				}
				taken[at]++
				op.gpus = appendOnce(op.gpus, at)
			}
		}
	}
	least := identified + len(extra)
	most := min(len(own), identified+missing)
	if most > least {
		v.Slack += most - least
	}
	what := fmt.Sprintf("on node %s, the device plugin shares each GPU as %d units of %s (time-slicing, MPS or MIG): each GPU its pods hold is counted once, with all its memory",
		node, replicas, resource)
	if missing > 0 {
		what += fmt.Sprintf("; %s ran nothing seen on %s of %s in the window, so which GPUs they hold is not known: counted on the fewest they fit (%d to %d GPUs)",
			plural(pods, "pod"), plural(missing, "unit"), resource, least, max(least, most))
	}
	v.Notes = append(v.Notes, what)
	return missing
}

// seenPod is a ConfigMap's entry for a pod, and the node it is for.
type seenPod struct {
	node string
	pod  api.ObservedPod
}

// observedUse reads the kubelet plugins' observed-usage ConfigMaps of fgpuNamespace: each
// pod's entry by UID. A ConfigMap elsewhere, or whose name, label and content do not name
// the same node, is not the plugins'.
func observedUse(maps []*corev1.ConfigMap, fgpuNamespace string) map[string]seenPod {
	out := map[string]seenPod{}
	for _, cm := range maps {
		node := cm.Labels[api.LabelObservedUsage]
		var u api.ObservedUsage
		if cm.Namespace != fgpuNamespace || cm.Name != api.ObservedUsagePrefix+node ||
			json.Unmarshal([]byte(cm.Data[api.ObservedUsageKey]), &u) != nil || u.Node != node {
			continue
		}
		for _, op := range u.Pods {
			out[op.UID] = seenPod{node: node, pod: op}
		}
	}
	return out
}

// asked is how many of resource a pod holds: the most its containers hold at once, as the
// kubelet counts them (init containers one at a time, before the others; restartable init
// containers, sidecars, alongside everything after them). A container's limit, or its
// request where it has no limit.
func asked(p *corev1.Pod, resource corev1.ResourceName) int64 {
	of := func(c corev1.Container) int64 {
		q, ok := c.Resources.Limits[resource]
		if !ok {
			q = c.Resources.Requests[resource]
		}
		return min(max(q.Value(), 0), maxUnits)
	}
	var sidecars, peak, sum int64
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars += of(c)
			continue
		}
		peak = max(peak, sidecars+of(c))
	}
	for _, c := range p.Spec.Containers {
		sum += of(c)
	}
	return min(max(sum+sidecars, peak), maxUnits)
}

// maxUnits bounds what one pod is counted to ask for, before its node says how much it
// offers: no node offers more, and each unit is a GPU the count makes.
const maxUnits = 1024

// template is a GPU of node, not located, as its pods are counted on: the node's model and
// memory where all its published GPUs have the same, else unknown (0).
func template(node string, own []*GPU) GPU {
	t := GPU{Node: node}
	if len(own) == 0 {
		return t
	}
	t.Product, t.Memory = own[0].Product, own[0].Memory
	for _, g := range own[1:] {
		if g.Product != t.Product || g.Memory != t.Memory {
			return GPU{Node: node}
		}
	}
	return t
}

func appendOnce(gs []*GPU, g *GPU) []*GPU {
	if slices.Contains(gs, g) {
		return gs
	}
	return append(gs, g)
}

// plural is n of a thing: 1 GPU, 2 GPUs.
func plural(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
