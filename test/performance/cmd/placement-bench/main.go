// Command placement-bench times one placement decision made by fgpu and by the upstream
// DRA structured allocator on the same cluster state (see test/performance/drabench):
//
//	go run ./test/performance/cmd/placement-bench --iters 30
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/fgpu-dev/fgpu/test/performance/drabench"
)

func main() {
	if err := command().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "placement-bench:", err)
		os.Exit(1)
	}
}

func command() *cobra.Command {
	var output string
	var share int64
	var sizes []int
	var fills []float64
	var iters int
	cmd := &cobra.Command{
		Use:           "placement-bench",
		Short:         "Time one placement decision: fgpu vs the upstream DRA structured allocator",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, n := range sizes {
				if n <= 0 {
					return fmt.Errorf("bad number %d", n)
				}
			}
			for _, f := range fills {
				if f < 0 || f >= 1 {
					return fmt.Errorf("bad fill %g (0 <= fill < 1)", f)
				}
			}
			var out []*drabench.Result
			w := cmd.OutOrStdout()
			if output == "table" {
				fmt.Fprintf(w, "%8s %5s %12s %14s %10s %9s\n", "nodes", "fill", "fgpu us", "upstream us", "ratio", "feasible")
			}
			for _, n := range sizes {
				for _, f := range fills {
					r, err := drabench.Run(n, f, share, iters, 1)
					if err != nil {
						return err
					}
					out = append(out, r)
					if output == "table" {
						fmt.Fprintf(w, "%8d %5.2f %12.1f %14.1f %9.0fx %4d/%-4d\n", r.Nodes, r.Fill, r.FgpuUs, r.UpstreamUs, r.Ratio, r.FgpuFits, r.Feasible)
					}
				}
			}
			if output == "json" {
				enc := json.NewEncoder(w)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			return nil
		},
	}
	cmd.Flags().IntSliceVar(&sizes, "nodes", []int{100, 1000, 10000}, "cluster sizes (nodes of 8 GPUs)")
	cmd.Flags().Float64SliceVar(&fills, "fill", []float64{0.5, 0.9}, "GPU fill fractions")
	cmd.Flags().Int64Var(&share, "share", 300, "the new claim's share of one GPU, milli")
	cmd.Flags().IntVar(&iters, "iters", 50, "decisions timed per side (upstream stops after 20 s)")
	cmd.Flags().StringVarP(&output, "output", "o", "table", "table or json")
	return cmd
}
