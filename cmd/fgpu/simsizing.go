package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/fgpu-dev/fgpu/pkg/sizingsim"
)

type simSizingFlags struct {
	trace, output     string
	headroom          float64
	history, halfLife time.Duration
	grid              bool
}

func newSimSizingCmd() *cobra.Command {
	var f simSizingFlags
	cmd := &cobra.Command{
		Use:   "sizing",
		Short: "Replay genai_v2026's per-container GPU use online against sizing strategies",
		Long: `Replay every container of the genai_v2026 trace (GPU memory and duty cycle every
57 s), online, on 80 GiB GPUs placed best-fit by memory, under: whole (a GPU per
container), human (its true peak rounded up to 8 GiB, known in advance), initial (fgpu
Initial: it asks a whole GPU; only a restart after running out of memory is sized),
auto (fgpu Auto: also restarted larger as its use nears its cap, smaller once its use
stayed far below it for the history), oracle (true peaks repacked perfectly at every
step). Prints GPUs in use (peak, time-average), containers per GPU and cap violations
(steps a container used more than its cap) per 100 container-hours.`,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSimSizing(cmd.OutOrStdout(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", "../shared/traces/genai_v2026", "the genai_v2026 directory")
	fl.StringVarP(&f.output, "output", "o", "table", "output: table or json")
	fl.Float64Var(&f.headroom, "headroom", 0.15, "recommendation headroom (the allocator's --sizing-headroom)")
	fl.DurationVar(&f.history, "history", time.Hour, "history before a recommendation (the allocator's --sizing-min-samples, in time)")
	fl.DurationVar(&f.halfLife, "half-life", 24*time.Hour, "the recommender's half-life (--sizing-half-life)")
	fl.BoolVar(&f.grid, "grid", false, "also replay Auto over a grid of headroom, history and half-life")
	return cmd
}

type gridRow struct {
	Headroom float64 `json:"headroom"`
	History  string  `json:"history"`
	HalfLife string  `json:"half_life"`
	sizingsim.Result
}

func runSimSizing(w io.Writer, f simSizingFlags) error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("unknown output %q (table or json)", f.output)
	}
	tr, err := sizingsim.LoadGenAI(f.trace)
	if err != nil {
		return err
	}
	opts := func(headroom float64, history, halfLife time.Duration) sizingsim.Options {
		o := sizingsim.DefaultOptions(tr.StepSeconds)
		o.Sizing.Headroom, o.Sizing.HalfLife = headroom, halfLife
		o.Sizing.MinSamples = max(1, int(history.Seconds()/tr.StepSeconds))
		return o
	}
	progress := func(done, total int) { fmt.Fprintf(os.Stderr, "\rreplaying %3d%%", done*100/total) }
	results := sizingsim.Run(tr, opts(f.headroom, f.history, f.halfLife), progress)
	var grid []gridRow
	if f.grid {
		for _, h := range []float64{0.05, 0.15, 0.3} {
			for _, hist := range []time.Duration{time.Hour, 6 * time.Hour} {
				for _, hl := range []time.Duration{2 * time.Hour, 24 * time.Hour} {
					r := sizingsim.Auto(tr, opts(h, hist, hl), progress)
					grid = append(grid, gridRow{Headroom: h, History: hist.String(), HalfLife: hl.String(), Result: r})
				}
			}
		}
	}
	fmt.Fprint(os.Stderr, "\r               \r")
	if f.output == "json" {
		return json.NewEncoder(w).Encode(map[string]any{"trace": f.trace, "containers": len(tr.Containers),
			"step_seconds": tr.StepSeconds, "steps": tr.Steps, "strategies": results, "grid": grid})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "%d containers, %d steps of %.0f s; headroom %.2f, history %s, half-life %s\n", len(tr.Containers), tr.Steps, tr.StepSeconds, f.headroom, f.history, f.halfLife)
	fmt.Fprintln(tw, "strategy\tGPUs peak\tGPUs mean\tcontainers/GPU\tviolations/100h\trestarts\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.2f\t%d\t\n", r.Strategy, r.GPUsPeak, r.GPUsMean, r.ContainersPerGPU, r.ViolationsPer100h, r.Restarts)
	}
	if len(grid) > 0 {
		fmt.Fprintln(tw, "\t\t\t\t\t\t")
		fmt.Fprintln(tw, "auto: headroom\thistory\thalf-life\tGPUs mean\tviolations/100h\trestarts\t")
		for _, g := range grid {
			fmt.Fprintf(tw, "%.2f\t%s\t%s\t%.1f\t%.2f\t%d\t\n", g.Headroom, g.History, g.HalfLife, g.GPUsMean, g.ViolationsPer100h, g.Restarts)
		}
	}
	return tw.Flush()
}
