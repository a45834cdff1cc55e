package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sim"
)

type simFlags struct {
	nodes, pods, policy, seeds, output, plot string
	knobs                                    string
	learn, blind                             bool
	tune                                     float64
	batch, orders, parallel                  int
}

func newSimCmd() *cobra.Command {
	var f simFlags
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Replay the FGD paper's protocol on openb CSV traces",
		Long: `Replay the FGD paper's protocol: pods of the workload (plus pods drawn with
replacement) arrive in a seeded random order until their GPU demand reaches
--tune x the cluster's GPUs; each is placed by the policy or dropped; nothing
departs. Prints the GPU allocation ratio as arrived demand grows.`,
		RunE: func(cmd *cobra.Command, _ []string) error { return runSim(cmd.OutOrStdout(), f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.nodes, "nodes", "", "node list CSV (sn,cpu_milli,memory_mib,gpu,model)")
	fl.StringVar(&f.pods, "pods", "", "pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])")
	fl.StringVar(&f.policy, "policy", "fgpu", "placement policy: "+strings.Join(placement.Names(), ", "))
	fl.StringVar(&f.seeds, "seeds", "42-51", "seeds: N, A-B or a comma list")
	fl.Float64Var(&f.tune, "tune", 1.3, "arrived GPU demand at the end, as a multiple of cluster GPU capacity")
	fl.IntVar(&f.batch, "batch", 1, "pods decided together (1 = online)")
	fl.IntVar(&f.orders, "orders", placement.BatchOrders, "with --batch > 1: orders tried per batch, the best plan kept (1 = arrival order)")
	fl.IntVar(&f.parallel, "parallel", 0, "seeds replayed at once (0 = all CPUs; 1 for clean latency figures)")
	fl.StringVarP(&f.output, "output", "o", "table", "output: table or json")
	fl.StringVar(&f.plot, "plot", "", "also draw the curve to this PNG file")
	fl.BoolVar(&f.learn, "learn", false, "give the policy the workload learned from the pods arrived so far, as the allocator learns it from claims (else the whole pod list's)")
	fl.BoolVar(&f.blind, "topology-blind", false, "withhold the nodes' wiring (the openb model's NVLink islands and PCIe roots) from the policy, as before policies read it; locality is still measured against the model")
	fl.StringVar(&f.knobs, "knobs", "", "with --policy fgpu: set options and ablations by name, e.g. MixReach=0,TieWhole=all (docs/placement.md, \"Knobs\")")
	_ = cmd.MarkFlagRequired("nodes")
	_ = cmd.MarkFlagRequired("pods")
	cmd.AddCommand(newSimSizingCmd())
	return cmd
}

func runSim(w io.Writer, f simFlags) error {
	if f.output != "table" && f.output != "json" {
		return fmt.Errorf("unknown output %q (table or json)", f.output)
	}
	if f.batch < 1 {
		return fmt.Errorf("--batch must be at least 1")
	}
	if f.orders < 1 || f.orders > 1000 {
		return fmt.Errorf("--orders must be 1..1000")
	}
	seeds, err := parseSeeds(f.seeds)
	if err != nil {
		return err
	}
	if _, err := placement.New(f.policy, nil); err != nil {
		return err
	}
	nodes, pods, err := loadTrace(f.nodes, f.pods)
	if err != nil {
		return err
	}
	cfg := sim.Config{Nodes: nodes, Pods: pods, Policy: f.policy, Tune: f.tune, Batch: f.batch, Orders: f.orders, Parallel: f.parallel, TopologyBlind: f.blind}
	if f.learn {
		lo := placement.DefaultLearnOptions()
		cfg.Learn = &lo
	}
	if f.knobs != "" {
		if f.policy != "fgpu" && f.policy != "" {
			return fmt.Errorf("--knobs needs --policy fgpu")
		}
		o, a := placement.DefaultOptions(), placement.Ablations{}
		if err := setKnobs(&o, &a, f.knobs); err != nil {
			return err
		}
		cfg.NewPolicy = func(w placement.Workload) placement.Policy {
			return placement.NewAblatedFGPU(w, o, a)
		}
	}
	var progress func(done, total int)
	if term.IsTerminal(int(os.Stderr.Fd())) {
		progress = func(done, total int) {
			bar := strings.Repeat("#", 30*done/total) + strings.Repeat(".", 30-30*done/total)
			fmt.Fprintf(os.Stderr, "\r%s [%s] %d/%d seeds", f.policy, bar, done, total)
			if done == total {
				fmt.Fprintln(os.Stderr)
			}
		}
	}
	sum, _, err := sim.RunSeeds(cfg, seeds, progress)
	if err != nil {
		return err
	}
	sum.Workload = workloadName(f.pods)
	if f.plot != "" {
		if err := sim.PlotFile(f.plot, sum.Workload, []*sim.Summary{sum}); err != nil {
			return err
		}
	}
	if f.output == "json" {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(sum)
	}
	printTable(w, sum)
	return nil
}

func printTable(w io.Writer, s *sim.Summary) {
	fmt.Fprintf(w, "policy %s, workload %s, %d seeds, batch %d", s.Policy, s.Workload, len(s.Seeds), s.Batch)
	if s.TopologyBlind {
		fmt.Fprint(w, ", topology-blind")
	}
	if s.Batch > 1 {
		fmt.Fprintf(w, " (%d orders)", s.Orders)
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "%10s  %12s  %6s\n", "arrived %", "allocated %", "std")
	for _, p := range s.Curve {
		fmt.Fprintf(w, "%10.0f  %12.2f  %6.2f\n", p.ArrivedPct, p.AllocPct, p.StdPct)
	}
	fmt.Fprintf(w, "unallocated GPUs at end: %.1f (%.1f whole, %.1f in partly used GPUs)\n",
		s.Unallocated, s.UnallocWhole, s.UnallocPartial)
	if s.RepackBound > 0 {
		fmt.Fprintf(w, "bound for the same admitted fractional pods, optimally repacked: %.2f%%\n", s.RepackBound)
	}
	fmt.Fprintf(w, "failed GPU demand (GPUs): fractional %.1f, one-GPU %.1f, multi-GPU %.1f\n",
		s.FailedGPUs["fractional"], s.FailedGPUs["one_gpu"], s.FailedGPUs["multi_gpu"])
	l := s.Locality
	fmt.Fprintf(w, "multi-GPU pods placed: %.1f; in one NVLink island: %.1f of the %.1f with room in one (%.1f%%); under one PCIe root: %.1f of %.1f (%.1f%%)\n",
		l.Pods, l.InIsland, l.IslandRoom, l.InIslandPct, l.InRoot, l.RootRoom, l.InRootPct)
	fmt.Fprintf(w, "decision latency: p50 %.1f us, p99 %.1f us; wall %.1f s\n", s.P50us, s.P99us, s.Wall)
}

// workloadName turns openb_pod_list_default.csv into "default".
func workloadName(path string) string {
	b := strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
	return strings.TrimPrefix(b, "openb_pod_list_")
}

func parseSeeds(s string) ([]int64, error) {
	var out []int64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if a, b, ok := strings.Cut(part, "-"); ok && a != "" {
			lo, err1 := strconv.ParseInt(a, 10, 64)
			hi, err2 := strconv.ParseInt(b, 10, 64)
			if err1 != nil || err2 != nil || hi < lo || hi-lo > 10000 {
				return nil, fmt.Errorf("bad seed range %q", part)
			}
			for v := lo; v <= hi; v++ {
				out = append(out, v)
			}
			continue
		}
		v, err := strconv.ParseInt(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("bad seed %q", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds")
	}
	return out, nil
}

// loadTrace reads a trace's node and pod lists.
func loadTrace(nodesPath, podsPath string) ([]placement.NodeSpec, []placement.Request, error) {
	nodes, err := sim.LoadNodes(nodesPath)
	if err != nil {
		return nil, nil, err
	}
	pods, err := sim.LoadPods(podsPath)
	if err != nil {
		return nil, nil, err
	}
	return nodes, pods, nil
}
