package cli

import (
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/fgpu-dev/fgpu/pkg/clusterview"
)

func newRecommendationsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "recommendations",
		Aliases: []string{"recs"},
		Short:   "Recommended sizes per workload, from measured GPU use",
		Args:    cobra.NoArgs,
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
		recs, err := clusterview.Recommendations(cmd.Context(), client, ns)
		if err != nil {
			return err
		}
		return write(cmd.OutOrStdout(), *out, recs, func(w io.Writer) error { return clusterview.PrintRecommendations(w, recs, time.Now()) })
	}
	return cmd
}
