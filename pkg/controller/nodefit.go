package controller

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
)

// nodeFit is one decision's memo of pod-fit verdicts: the filter asks once per GPU, and
// hashing the node name, or filling a map of every node, cost a fifth of a decision; so
// verdicts are kept by the placement core's node index, in the model's fitMemo.
type nodeFit struct {
	gen    uint64           // this decision's stamp in the model's fitMemo (0: none yet)
	byName map[string]error // nodes the core does not index
	// checkers are the pending pods' pod-fit checkers, built once per decision; verdicts
	// their node verdicts (model.verdicts), looked up once per decision.
	checkers []*podfit.Checker
	verdicts [][]nodeVerdict
}

// nodeFitsAt checks the claim's pods against node ni of the placement core: affinity,
// taints, CPU, memory, pods, the pods' other claims, and nodes where an earlier allocation
// timed out.
func (dc *decider) nodeFitsAt(tx *model.Tx, in *input, ni int, nodeName string) error {
	f := &in.fit
	m := &dc.memo.fit
	if f.gen == 0 {
		f.gen = m.next(len(tx.CoreGPUs()))
	}
	if ni >= len(m.at) {
		if err, ok := f.byName[nodeName]; ok {
			return err
		}
		err := dc.nodeFits(tx, in, nodeName, -1)
		if f.byName == nil {
			f.byName = map[string]error{}
		}
		f.byName[nodeName] = err
		return err
	}
	if m.at[ni] == f.gen {
		return m.err[ni]
	}
	err := dc.nodeFits(tx, in, nodeName, ni)
	m.at[ni], m.err[ni] = f.gen, err
	return err
}

// fitMemo holds the verdicts of nodeFit by core node index, each stamped with the decision
// that found it: a decision at 10,000 nodes asks a few hundred nodes, and a memo of its
// own would allocate and clear one entry per node. It is the decider's (fitMemos), used
// inside model transactions only.
type fitMemo struct {
	at  []uint64 // the stamp of the decision whose verdict err holds
	err []error
	gen uint64
}

// next starts a decision over nodes core nodes and returns its stamp: the entries of every
// earlier one no longer count.
func (m *fitMemo) next(nodes int) uint64 {
	if len(m.at) != nodes {
		m.at, m.err = make([]uint64, nodes), make([]error, nodes)
	}
	m.gen++
	return m.gen
}

// nodeFits checks the pods against node nodeName, which is node ni of the placement core
// (-1: unknown).
func (dc *decider) nodeFits(tx *model.Tx, in *input, nodeName string, ni int) error {
	if in.avoid[nodeName] {
		return fmt.Errorf("an earlier allocation on node %s timed out: the pod did not bind there", nodeName)
	}
	node, err := dc.nodes.Get(nodeName)
	if err != nil {
		return fmt.Errorf("node %s: no Node object", nodeName)
	}
	if len(in.pods) == 0 {
		return nil
	}
	requested := dc.ledger.Requested(nodeName, in.pods)
	// The claim's share may need an MPS daemon pod of its own on the node, which requests
	// nothing but takes a pod slot: keep one free, or a tenant that filled the node's pod
	// slots would leave the pod waiting in ContainerCreating for a daemon the kubelet refuses.
	requested.Pods++
	f := &in.fit
	if f.checkers == nil {
		f.checkers = make([]*podfit.Checker, len(in.pods))
		for i, pod := range in.pods {
			f.checkers[i] = podfit.NewChecker(pod)
		}
	}
	for i, pod := range in.pods {
		// Each pod costs its namespace's share on every node it is checked on, with its
		// other claims: a tenant's many pods of one claim are its own work to pay for.
		in.checks++
		if err := dc.fitsNode(tx, in, i, ni, node); err != nil {
			return err
		}
		if err := f.checkers[i].FitsResources(node, requested); err != nil {
			return err
		}
		requested.Add(f.checkers[i].Requests)
		others := in.otherClaims[pod.UID]
		in.checks += len(others)
		for _, o := range others {
			if !o.sel.Match(node) {
				return fmt.Errorf("the pod's claim %s is allocated where node %s is not", o.name, node.Name)
			}
		}
	}
	return nil
}

// fitMemos are the pod-fit verdicts kept across decisions (fitMemo, nodeVerdicts).
type fitMemos struct {
	fit      fitMemo
	verdicts nodeVerdicts
}

func newFitMemos() *fitMemos { return &fitMemos{verdicts: nodeVerdicts{}} }

// nodeVerdict is podfit's FitsNode answer for one Node object.
type nodeVerdict struct {
	node *corev1.Node
	err  error
}

// nodeVerdicts keeps FitsNode verdicts by pod constraints and core node index, across
// decisions: pods of one template ask the same of every node, and a decision asks every
// node. It is the decider's (fitMemos), used inside model transactions only.
type nodeVerdicts map[string][]nodeVerdict

// maxPodShapes bounds the pod constraint sets whose node verdicts are kept.
const maxPodShapes = 256

// fitsNode is podfit's FitsNode for pending pod i, remembered across decisions. A verdict
// holds while the informer keeps the same Node object (any update replaces it).
func (dc *decider) fitsNode(tx *model.Tx, in *input, i, ni int, node *corev1.Node) error {
	f := &in.fit
	checker := f.checkers[i]
	nodes := len(tx.CoreGPUs())
	if ni < 0 || ni >= nodes {
		return checker.FitsNode(node)
	}
	if f.verdicts == nil {
		f.verdicts = make([][]nodeVerdict, len(in.pods))
	}
	vs := f.verdicts[i]
	if len(vs) != nodes {
		key := checker.ConstraintsKey()
		all := dc.memo.verdicts
		vs = all[key]
		if len(vs) != nodes {
			if len(all) >= maxPodShapes {
				clear(all)
			}
			vs = make([]nodeVerdict, nodes)
			all[key] = vs
		}
		f.verdicts[i] = vs
	}
	v := &vs[ni]
	if v.node != node {
		v.node, v.err = node, checker.FitsNode(node)
	}
	return v.err
}

// otherClaim is another allocated claim of a pending pod: the pod can run only where its
// allocation can be used.
type otherClaim struct {
	name string
	sel  *nodeaffinity.NodeSelector
}

// otherClaims are the pod's other claims that are allocated to nodes, with their node
// selectors. Called outside the model's lock: a pod may name any number of claims.
func (l *listers) otherClaims(pod *corev1.Pod, self *resourceapi.ResourceClaim) []otherClaim {
	var out []otherClaim
	for _, name := range podClaimNames(pod) {
		if name == self.Name {
			continue
		}
		other, err := l.claims.ResourceClaims(pod.Namespace).Get(name)
		if err != nil || other.Status.Allocation == nil || other.Status.Allocation.NodeSelector == nil {
			continue
		}
		sel, err := nodeaffinity.NewNodeSelector(other.Status.Allocation.NodeSelector)
		if err != nil {
			continue
		}
		out = append(out, otherClaim{name: name, sel: sel})
	}
	return out
}

// podClaimNames lists the ResourceClaim names a pod uses.
func podClaimNames(pod *corev1.Pod) []string {
	var out []string
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, *rc.ResourceClaimName)
			continue
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == rc.Name && s.ResourceClaimName != nil {
				out = append(out, *s.ResourceClaimName)
			}
		}
	}
	return out
}
