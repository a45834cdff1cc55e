// Command fgpu is fgpu's command-line tool: placement simulation and plots, and a view
// of the cluster's GPUs. The logic lives in pkg/placement, pkg/sim and pkg/clusterview;
// this is wiring.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

func main() {
	root := &cobra.Command{
		Use:           "fgpu",
		Short:         "fgpu: fractional GPU placement tools",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newSimCmd(), newPlotCmd(), newGPUsCmd(), newFaultsCmd(), newRecommendationsCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "fgpu:", err)
		os.Exit(1)
	}
}
