package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fgpu-dev/fgpu/pkg/sim"
)

func newPlotCmd() *cobra.Command {
	var f simFlags
	var policies, out string
	var batches []int
	cmd := &cobra.Command{
		Use:   "plot",
		Short: "Plot several policies' allocation vs arrived demand to a PNG",
		RunE: func(cmd *cobra.Command, _ []string) error {
			seeds, err := parseSeeds(f.seeds)
			if err != nil {
				return err
			}
			nodes, pods, err := loadTrace(f.nodes, f.pods)
			if err != nil {
				return err
			}
			var sums []*sim.Summary
			for i, p := range strings.Split(policies, ",") {
				b := 1
				if i < len(batches) {
					b = batches[i]
				}
				s, _, err := sim.RunSeeds(sim.Config{Nodes: nodes, Pods: pods, Policy: strings.TrimSpace(p), Tune: f.tune, Batch: b, Parallel: f.parallel}, seeds, nil)
				if err != nil {
					return err
				}
				s.Workload = workloadName(f.pods)
				fmt.Fprintf(cmd.OutOrStdout(), "%-8s batch %-3d at 100%%: %.2f  at %.0f%%: %.2f\n", s.Policy, b, s.AllocAt100, 100*f.tune, s.AllocAt130)
				sums = append(sums, s)
			}
			return sim.PlotFile(out, "openb "+workloadName(f.pods), sums)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.nodes, "nodes", "", "node list CSV")
	fl.StringVar(&f.pods, "pods", "", "pod list CSV")
	fl.StringVar(&f.seeds, "seeds", "42-51", "seeds")
	fl.Float64Var(&f.tune, "tune", 1.3, "arrived GPU demand at the end / capacity")
	fl.StringVar(&policies, "policies", "random,bestfit,fgd,fgpu", "policies, comma separated")
	fl.IntSliceVar(&batches, "batches", nil, "batch size per policy (default 1 each)")
	fl.IntVar(&f.parallel, "parallel", 0, "seeds replayed at once (0 = all CPUs)")
	fl.StringVarP(&out, "out", "o", "placement.png", "PNG file to write")
	_ = cmd.MarkFlagRequired("nodes")
	_ = cmd.MarkFlagRequired("pods")
	return cmd
}
