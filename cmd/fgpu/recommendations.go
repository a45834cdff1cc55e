package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newRecommendationsCmd() *cobra.Command {
	var namespace string
	flags := clientcmd.NewDefaultClientConfigLoadingRules()
	cmd := &cobra.Command{
		Use:     "recommendations",
		Aliases: []string{"recs"},
		Short:   "Show the size the allocator recommends for each workload, from its claims' measured GPU use",
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := clusterClient(flags)
			if err != nil {
				return err
			}
			recs, err := clusterview.Recommendations(cmd.Context(), client, namespace)
			if err != nil {
				return err
			}
			return clusterview.PrintRecommendations(os.Stdout, recs, time.Now())
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "", "only this namespace (default: all)")
	cmd.Flags().StringVar(&flags.ExplicitPath, "kubeconfig", "", "kubeconfig (default $KUBECONFIG or ~/.kube/config)")
	return cmd
}
