// Command fgpu is fgpu's command-line tool: placement simulation, benchmarks
// and plots. The logic lives in pkg/placement and pkg/sim; this is wiring.
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
	root.AddCommand(newSimCmd(), newBenchCmd(), newPlotCmd(), newGPUsCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "fgpu:", err)
		os.Exit(1)
	}
}
