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

func newReportCmd() *cobra.Command {
	var driver, fgpuNamespace, extendedResource string
	var since time.Duration
	cmd := viewCmd(&cobra.Command{
		Use:   "report",
		Short: "GPUs held now against those needed at measured sizes",
		Long: `For each workload with fgpu claims (every namespace, or -n's): the GPUs and memory its
claims hold, the memory and SM activity the kubelet plugin measured within --since, and
the size fgpu recommends; and likewise each workload whose pods hold GPUs outside fgpu
(NVIDIA's device plugin): what they hold is what they ask for (--extended-resource), each
GPU counted once where the device plugin time-slices it, and their use is what fgpu's
observe mode measured. Then the GPUs they all hold now against the GPUs the same
workloads would need at the recommended sizes, packed by the allocator's placement core.
It only reads, with your own credentials.`,
		Args: cobra.NoArgs,
	}, namespaceOrAll, func(ctx context.Context, kc kubernetes.Interface, _ versioned.Interface, ns string, _ []string) (any, func(io.Writer) error, error) {
		r, err := clusterview.Report(ctx, kc, driver, fgpuNamespace, extendedResource, ns, since, time.Now())
		return r, func(w io.Writer) error { return clusterview.PrintReport(w, r) }, err
	})
	cmd.Flags().StringVar(&driver, "driver", api.DriverName, "DRA driver name")
	cmd.Flags().StringVar(&fgpuNamespace, "fgpu-namespace", "fgpu-system", "fgpu's namespace, where the kubelet plugins keep what they measure of GPU pods fgpu did not place")
	cmd.Flags().StringVar(&extendedResource, "extended-resource", clusterview.DefaultExtendedResource,
		"the resource GPU pods fgpu did not place ask NVIDIA's device plugin for (the chart's extendedResource.name): what they hold is counted from it")
	cmd.Flags().DurationVar(&since, "since", 24*time.Hour, "count only use and recommendations measured this recently")
	return cmd
}
