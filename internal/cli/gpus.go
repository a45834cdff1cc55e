package cli

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newGPUsCmd() *cobra.Command {
	var driver string
	cmd := viewCmd(&cobra.Command{
		Use:   "gpus",
		Short: "Who shares which GPU, and how much each tenant holds",
		Args:  cobra.NoArgs,
	}, clusterScope, func(ctx context.Context, kc kubernetes.Interface, _ versioned.Interface, _ string, _ []string) (any, func(io.Writer) error, error) {
		gpus, err := clusterview.Gather(ctx, kc, driver)
		return gpus, func(w io.Writer) error { return clusterview.Print(w, gpus) }, err
	})
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newWhyCmd() *cobra.Command {
	var driver string
	cmd := viewCmd(&cobra.Command{
		Use:   "why POD",
		Short: "Why a pod waits for its GPU share, or where it went",
		Args:  cobra.ExactArgs(1),
	}, namespaceScope, func(ctx context.Context, kc kubernetes.Interface, _ versioned.Interface, ns string, args []string) (any, func(io.Writer) error, error) {
		r, err := clusterview.Why(ctx, kc, driver, ns, args[0])
		return r, func(w io.Writer) error { return clusterview.PrintWhy(w, r, time.Now()) }, err
	})
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newTopCmd() *cobra.Command {
	var driver string
	cmd := viewCmd(&cobra.Command{
		Use:   "top",
		Short: "Measured GPU memory and SM use of each share vs its caps",
		Args:  cobra.NoArgs,
	}, anyNamespace, func(ctx context.Context, kc kubernetes.Interface, _ versioned.Interface, ns string, _ []string) (any, func(io.Writer) error, error) {
		shares, err := clusterview.Top(ctx, kc, driver, ns)
		return shares, func(w io.Writer) error { return clusterview.PrintTop(w, shares, time.Now()) }, err
	})
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newQuotaCmd() *cobra.Command {
	var driver string
	cmd := viewCmd(&cobra.Command{
		Use:   "quota",
		Short: "Each namespace's GPU quota against what its claims hold",
		Args:  cobra.NoArgs,
	}, anyNamespace, func(ctx context.Context, kc kubernetes.Interface, fc versioned.Interface, ns string, _ []string) (any, func(io.Writer) error, error) {
		quotas, err := clusterview.Quotas(ctx, kc, fc, driver, ns)
		return quotas, func(w io.Writer) error { return clusterview.PrintQuotas(w, quotas) }, err
	})
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}
