package cli

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newGPUsCmd() *cobra.Command {
	var driver string
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "Who shares which GPU, and how much each tenant holds",
		Args:  cobra.NoArgs,
	}
	kf := addKubeFlags(cmd, clusterScope)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		client, _, err := kf.clients()
		if err != nil {
			return err
		}
		gpus, err := clusterview.Gather(cmd.Context(), client, driver)
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, gpus, func(w io.Writer) error { return clusterview.Print(w, gpus) })
	}
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newWhyCmd() *cobra.Command {
	var driver string
	cmd := &cobra.Command{
		Use:   "why POD",
		Short: "Why a pod waits for its GPU share, or where it went",
		Args:  cobra.ExactArgs(1),
	}
	kf := addKubeFlags(cmd, namespaceScope)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		client, _, err := kf.clients()
		if err != nil {
			return err
		}
		ns, err := kf.namespace()
		if err != nil {
			return err
		}
		r, err := clusterview.Why(cmd.Context(), client, driver, ns, args[0])
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, r, func(w io.Writer) error { return clusterview.PrintWhy(w, r, time.Now()) })
	}
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newTopCmd() *cobra.Command {
	var driver string
	cmd := &cobra.Command{
		Use:   "top",
		Short: "Measured GPU memory and SM use of each share vs its caps",
		Args:  cobra.NoArgs,
	}
	kf := addKubeFlags(cmd, anyNamespace)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		client, _, err := kf.clients()
		if err != nil {
			return err
		}
		ns, err := kf.namespace()
		if err != nil {
			return err
		}
		shares, err := clusterview.Top(cmd.Context(), client, driver, ns)
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, shares, func(w io.Writer) error { return clusterview.PrintTop(w, shares, time.Now()) })
	}
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}

func newQuotaCmd() *cobra.Command {
	var driver string
	cmd := &cobra.Command{
		Use:   "quota",
		Short: "Each namespace's GPU quota against what its claims hold",
		Args:  cobra.NoArgs,
	}
	kf := addKubeFlags(cmd, anyNamespace)
	out := addOutputFlag(cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		client, fc, err := kf.clients()
		if err != nil {
			return err
		}
		ns, err := kf.namespace()
		if err != nil {
			return err
		}
		quotas, err := clusterview.Quotas(cmd.Context(), client, fc, driver, ns)
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, quotas, func(w io.Writer) error { return clusterview.PrintQuotas(w, quotas) })
	}
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	return cmd
}
