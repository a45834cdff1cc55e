package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
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
	window            time.Duration
	grid              bool
}

func newSimSizingCmd() *cobra.Command {
	var f simSizingFlags
	cmd := &cobra.Command{
		Use:   "sizing",
		Short: "Replay genai_v2026's per-container GPU use online against sizing strategies",
		Long: `Replay every container of the genai_v2026 trace (GPU memory and duty cycle every
57 s), online, on 80 GiB GPUs, under: whole (a GPU per container), human (its true peak
rounded up to 8 GiB, known in advance), initial (fgpu Initial: it asks a whole GPU; only
a restart after running out of memory is sized), auto (fgpu Auto, best-effort, every
decision the allocator's own sizing engine's: a container holds the whole GPU it asked for
until its workload is measured, then, unless it keeps a GPU busy or is mostly idle, it is
restarted guaranteed its typical interval peak and capped at twice its observed peak, on a
GPU that holds no share that does not burst, whose guaranteed memory fits, and whose
tenants' recorded interval maxima, summed in time with its own, stay within the GPU over
1 + headroom; each report, the GPU guaranteed least whose tenants all fit on other GPUs in
use is emptied), auto-per-claim (per-claim Auto: caps never
over-committed, restarted larger as its use nears its cap, smaller once its use stayed far
below it for the history) and oracle (true peaks repacked perfectly at every step).
Prints GPUs in use (peak and time-average, over the run and after the first history
window), containers per GPU, violations per 100 container-hours (steps a container used
more than its cap, or a GPU's tenants together more than it has) and restarts (of them,
those that emptied a GPU).`,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSimSizing(cmd.OutOrStdout(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.trace, "trace", "../shared/traces/genai_v2026", "the genai_v2026 directory")
	fl.StringVarP(&f.output, "output", "o", "table", "output: table or json")
	fl.Float64Var(&f.headroom, "headroom", 0.15, "recommendation headroom (the allocator's --sizing-headroom)")
	fl.DurationVar(&f.history, "history", 30*time.Minute, "history before a recommendation (the allocator's --sizing-min-samples, in time)")
	fl.DurationVar(&f.halfLife, "half-life", 24*time.Hour, "the recommender's half-life (--sizing-half-life)")
	fl.DurationVar(&f.window, "window", 24*time.Hour, "auto: the history its admission sums over")
	fl.BoolVar(&f.grid, "grid", false, "also replay auto and auto-per-claim over a grid of headroom and history")
	return cmd
}

type gridRow struct {
	Headroom float64 `json:"headroom"`
	History  string  `json:"history"`
	Window   string  `json:"window"`
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
	opts := func(headroom float64, history time.Duration) sizingsim.Options {
		o := sizingsim.DefaultOptions(tr.StepSeconds)
		o.Sizing.Headroom, o.Sizing.HalfLife, o.Window = headroom, f.halfLife, f.window
		// As DefaultOptions counts it: whole steps covering the history, rounded up.
		o.Sizing.MinSamples = max(1, int(math.Ceil(history.Seconds()/tr.StepSeconds)))
		return o
	}
	progress := func(done, total int) { fmt.Fprintf(os.Stderr, "\rreplaying %3d%%", done*100/total) }
	results := sizingsim.Run(tr, opts(f.headroom, f.history), progress)
	var grid []gridRow
	if f.grid {
		for _, h := range []float64{0.05, 0.1, 0.15, 0.3} {
			for _, hist := range []time.Duration{30 * time.Minute, time.Hour, 3 * time.Hour} {
				o := opts(h, hist)
				for _, r := range []sizingsim.Result{sizingsim.Auto(tr, o, progress), sizingsim.AutoPerClaim(tr, o, progress)} {
					grid = append(grid, gridRow{Headroom: h, History: hist.String(), Window: f.window.String(), Result: r})
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
	fmt.Fprintf(w, "%d containers, %d steps of %.0f s; headroom %.2f, history %s, half-life %s, window %s\n", len(tr.Containers), tr.Steps, tr.StepSeconds, f.headroom, f.history, f.halfLife, f.window)
	fmt.Fprintln(tw, "strategy\tGPUs peak\tmean\tafter history: peak\tmean\tcontainers/GPU\tviolations/100h\tof them GPU over-full\trestarts\tto empty a GPU\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%d\t%.1f\t%.2f\t%.2f\t%d\t%d\t%d\t\n", r.Strategy, r.GPUsPeak, r.GPUsMean, r.GPUsPeakWarm, r.GPUsMeanWarm, r.ContainersPerGPU, r.ViolationsPer100h, r.OverfullViolations, r.Restarts, r.Consolidations)
	}
	if len(grid) > 0 {
		fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t\t\t")
		fmt.Fprintln(tw, "strategy\theadroom\thistory\tGPUs mean\tafter history\tviolations/100h\trestarts\t\t\t\t")
		for _, g := range grid {
			fmt.Fprintf(tw, "%s\t%.2f\t%s\t%.1f\t%.1f\t%.2f\t%d\t\t\t\t\n", g.Strategy, g.Headroom, g.History, g.GPUsMean, g.GPUsMeanWarm, g.ViolationsPer100h, g.Restarts)
		}
	}
	return tw.Flush()
}
