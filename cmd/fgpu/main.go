// Command fgpu is fgpu's command-line tool: the cluster views of internal/cli (also the
// kubectl plugin cmd/kubectl-fgpu), the placement simulator and plots (pkg/placement,
// pkg/sim), and fake-GPU fault injection on a node.
package main

import "github.com/fgpu-dev/fgpu/internal/cli"

func main() {
	root := cli.NewRoot("fgpu", "fgpu")
	root.Short = "fgpu: fractional GPU placement tools and views of the cluster's GPU shares"
	root.AddCommand(newSimCmd(), newPlotCmd(), newFaultsCmd())
	cli.Main(root)
}
