package placement

// Random puts each request on a uniformly random feasible node (the paper's
// "Random" baseline); inside the node it takes the tightest GPUs.
type Random struct{}

func (*Random) Name() string     { return "random" }
func (*Random) Attach(*Cluster)  {}
func (*Random) RandomTies() bool { return true }
func (*Random) Score(c *Cluster, n int, r *Request, elig, out []int) (float64, []int) {
	return 0, tightestGPUs(c, n, elig, r.GPUs, out)
}
