// Package cli is the cluster side of fgpu's command-line tool: views of the cluster's GPUs,
// pods, usage, quotas and sizing, in both `fgpu` and the kubectl plugin `kubectl-fgpu`. It
// imports no node-side package (the plugin, MPS), so the plugin builds for any OS kubectl
// runs on. The logic lives in pkg/clusterview; this is wiring.
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
		Short:         "fgpu: views of the cluster's fractional GPU shares",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: displayName},
	}
	root.AddCommand(newGPUsCmd(), newWhyCmd(), newTopCmd(), newQuotaCmd(), newRecommendationsCmd(), newReportCmd(), newWakeCmd())
	return root
}

// Main runs root and exits.
func Main(root *cobra.Command) {
	if err := root.ExecuteContext(context.Background()); err != nil {
		displayName := root.Annotations[cobra.CommandDisplayNameAnnotation]
		fmt.Fprintf(os.Stderr, "%s: %v\n", displayName, err)
		os.Exit(1)
	}
}
