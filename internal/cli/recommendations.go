package cli

import (
	"context"
	"io"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/kubernetes"

	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newRecommendationsCmd() *cobra.Command {
	return viewCmd(&cobra.Command{
		Use:     "recommendations",
		Aliases: []string{"recs"},
		Short:   "Recommended sizes per workload, from measured GPU use",
		Args:    cobra.NoArgs,
	}, anyNamespace, func(ctx context.Context, kc kubernetes.Interface, _ versioned.Interface, ns string, _ []string) (any, func(io.Writer) error, error) {
		recs, err := clusterview.Recommendations(ctx, kc, ns)
		return recs, func(w io.Writer) error { return clusterview.PrintRecommendations(w, recs, time.Now()) }, err
	})
}
