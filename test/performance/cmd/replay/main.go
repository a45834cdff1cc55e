// Command replay compares the allocator with fgpu sim on an openb trace: the allocation
// ratio the real controller reaches over a fake API server (test/performance/replay) next
// to fgpu sim's, with and without the learned workload, on the same seed; and the
// allocator's decision times by fill, informer sync, first decision and memory.
//
//	go run ./test/performance/cmd/replay --nodes ../shared/traces/openb/openb_node_list_gpu_node.csv \
//	  --pods ../shared/traces/openb/openb_pod_list_default.csv --seed 42
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/sim"
	"github.com/fgpu-dev/fgpu/test/performance/replay"
)

func main() {
	nodesPath := flag.String("nodes", "", "openb node list CSV")
	podsPath := flag.String("pods", "", "openb pod list CSV")
	seed := flag.Int64("seed", 42, "arrival order seed (as fgpu sim's)")
	tune := flag.Float64("tune", 1.3, "arrived GPU demand at the end, a multiple of GPU capacity")
	copies := flag.Int("replicate", 1, "copies of the node list (fresh names): 9 makes about 10,000 nodes")
	flag.Parse()
	if *nodesPath == "" || *podsPath == "" {
		fmt.Fprintln(os.Stderr, "--nodes and --pods are required")
		os.Exit(2)
	}
	if err := run(*nodesPath, *podsPath, *seed, *tune, *copies); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func run(nodesPath, podsPath string, seed int64, tune float64, copies int) error {
	nodes, err := sim.LoadNodes(nodesPath)
	if err != nil {
		return err
	}
	pods, err := sim.LoadPods(podsPath)
	if err != nil {
		return err
	}
	nodes = sim.Replicate(nodes, copies)
	cfg := replay.Config{Nodes: nodes, Pods: replay.GPUPods(pods), Seed: seed, Tune: tune, Fills: []float64{0.5, 0.9}}
	oracle, err := sim.Run(sim.Config{Nodes: nodes, Pods: cfg.Pods, Policy: "fgpu", Seed: seed, Tune: tune})
	if err != nil {
		return err
	}
	learned, err := replay.Sim(cfg)
	if err != nil {
		return err
	}
	rep, err := replay.Run(context.Background(), cfg)
	if err != nil {
		return err
	}
	name := strings.TrimSuffix(strings.TrimPrefix(podsPath[strings.LastIndex(podsPath, "/")+1:], "openb_pod_list_"), ".csv")
	fmt.Printf("workload %s, %d nodes, seed %d, tune %.2f, %d GPU pods arrived\n", name, len(nodes), seed, tune, rep.Arrived)
	fmt.Printf("allocation at %.0f%%: fgpu sim %.2f%%, fgpu sim --learn %.2f%%, replay %.2f%% (replay - sim --learn %+.2f points)\n",
		100*tune, 100*oracle.Final.Alloc, 100*learned.Final.Alloc, 100*rep.Alloc, 100*(rep.Alloc-learned.Final.Alloc))
	fmt.Printf("placed: sim --learn %d, replay %d; invariant: %v\n", learned.Placed, rep.Placed, errText(rep.Invariant))
	fmt.Printf("decisions digest %s\n", rep.Digest)
	fmt.Printf("informer sync %s, first decision %s after start\n", rep.Sync.Round(time.Millisecond), rep.First.Round(time.Millisecond))
	bands := []string{"fill < 50%", "50% <= fill < 90%", "fill >= 90%"}
	for i, d := range rep.Decisions {
		fmt.Printf("allocator Sync that decided (decide and write), %s: %s\n", bands[i], pct(d))
	}
	fmt.Printf("sim decisions: %s\n", pct(oracle.Decisions))
	perClaim := func(d time.Duration) time.Duration { return d / time.Duration(max(rep.Placed, 1)) }
	fmt.Printf("process CPU per placed claim %s, of which in the fake API server %s: allocator about %s\n",
		perClaim(rep.CPU).Round(time.Microsecond), perClaim(rep.InAPI).Round(time.Microsecond), perClaim(rep.CPU-rep.InAPI).Round(time.Microsecond))
	fmt.Printf("garbage collections %d, their CPU %.1f s of the process's %.1f s (runtime/metrics' estimate)\n",
		rep.GCCycles, rep.GCCPU.Seconds(), rep.CPU.Seconds())
	fmt.Printf("allocator API writes (%d claims placed of %d arrived):\n%s", rep.Placed, rep.Arrived, rep.WritesTable())
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	fmt.Printf("heap in use %.0f MiB, peak RSS %s (process: allocator, fake API server and simulators together)\n", float64(ms.HeapInuse)/(1<<20), replay.PeakRSS())
	return nil
}

func pct(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("n %d, p50 %s, p99 %s, max %s", len(s), at(0.5).Round(time.Microsecond), at(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
