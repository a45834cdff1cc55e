package placement

import (
	"fmt"
	"sort"
)

// Policy rates candidate nodes for a request. The Scheduler only offers nodes
// with the request's CPU and memory free and at least r.GPUs usable GPUs.
type Policy interface {
	Name() string
	// Attach binds the policy to the cluster it will score; a policy that
	// caches per-node values registers a Cluster.OnChange hook here.
	Attach(c *Cluster)
	// Score rates placing r on node n (higher is better). eligible lists the
	// node's GPUs that can serve r; the policy picks r.GPUs of them, appends
	// their indices to out and returns it.
	Score(c *Cluster, n int, r *Request, eligible []int, out []int) (float64, []int)
}

// RandomTies is implemented by policies whose equal scores must be broken at
// random, as upstream kube-scheduler does. Other policies get the best node
// with the smallest name, as the FGD artifact's patched scheduler does,
// which makes them deterministic.
type RandomTies interface{ RandomTies() bool }

// TieBreaker is implemented by policies that rank equal scores themselves:
// after Score(n), Tie(n) gives the node's group and a secondary value; among
// equal scores a node of the best node's group with a larger value wins, and
// name order decides otherwise. ok false leaves ties to name order.
type TieBreaker interface {
	Tie(n int) (group int, v float64, ok bool)
}

// Names lists the policies New knows.
func Names() []string { return []string{"fgpu", "fgd", "bestfit", "random", "spread", "pack"} }

// New returns the named policy. The workload shape distribution is used by
// the fragmentation-aware policies (fgd, fgpu) and ignored by the others;
// fgpu gets DefaultOptions.
func New(name string, w Workload) (Policy, error) {
	switch name {
	case "random":
		return &Random{}, nil
	case "spread":
		return Spread{}, nil
	case "pack":
		return Pack{}, nil
	case "bestfit":
		return &BestFit{ByName: true}, nil
	case "fgd":
		return NewFGD(w), nil
	case "fgpu", "":
		return NewFGPU(w, DefaultOptions()), nil
	}
	return nil, fmt.Errorf("unknown policy %q (known: %v)", name, Names())
}

// tightestGPUs picks k GPUs from eligible, least free first (best fit inside
// the node: partly used GPUs fill up before whole ones are broken).
func tightestGPUs(c *Cluster, n int, eligible []int, k int, out []int) []int {
	free := c.nodes[n].gpuFree
	start := len(out)
	out = append(out, eligible...)
	sel := out[start:]
	sort.SliceStable(sel, func(i, j int) bool { return free[sel[i]] < free[sel[j]] })
	return out[:start+k]
}

// Before orders a batch of pending requests for best-fit-decreasing: the
// hardest to place first (more GPUs, then larger shares, then more CPU), so
// small requests fill the gaps the large ones leave instead of creating them.
func Before(a, b *Request) bool {
	if da, db := a.GPUDemand(), b.GPUDemand(); da != db {
		return da > db
	}
	return a.CPUMilli > b.CPUMilli
}
