// Package cli is fgpu's command-line tool, built both as `fgpu` and as the kubectl plugin
// `kubectl-fgpu`: placement simulation and plots, and views of the cluster's GPUs, pods,
// usage and quotas. The logic lives in pkg/placement, pkg/sim and pkg/clusterview; this is
// wiring.
package cli

import (
	"context"
	"fmt"
	"os"

	"github.com/spf13/cobra"
)

// NewRoot is the command tree; displayName is how usage names it ("fgpu", "kubectl fgpu").
func NewRoot(use, displayName string) *cobra.Command {
	root := &cobra.Command{
		Use:           use,
		Short:         "fgpu: fractional GPU placement tools and views of the cluster's GPU shares",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: displayName},
	}
	root.AddCommand(newGPUsCmd(), newWhyCmd(), newTopCmd(), newQuotaCmd(), newRecommendationsCmd(),
		newSimCmd(), newPlotCmd(), newFaultsCmd())
	return root
}

// Main runs the command tree and exits.
func Main(use, displayName string) {
	if err := NewRoot(use, displayName).ExecuteContext(context.Background()); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", displayName, err)
		os.Exit(1)
	}
}
