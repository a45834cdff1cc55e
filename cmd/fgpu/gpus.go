package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newGPUsCmd() *cobra.Command {
	var driver string
	flags := clientcmd.NewDefaultClientConfigLoadingRules()
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "Show the cluster's fgpu GPUs, who shares each one, and how much each tenant holds",
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := clusterClient(flags)
			if err != nil {
				return err
			}
			gpus, err := clusterview.Gather(cmd.Context(), client, driver)
			if err != nil {
				return err
			}
			return clusterview.Print(os.Stdout, gpus)
		},
	}
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	cmd.Flags().StringVar(&flags.ExplicitPath, "kubeconfig", "", "kubeconfig (default $KUBECONFIG or ~/.kube/config)")
	return cmd
}
