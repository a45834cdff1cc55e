// Command scale-bench measures how the placement decision grows with the fleet: the openb
// node list replicated K times (fresh names), the pod list drawn to the same arrived demand
// (130% of the larger capacity, as fgpu sim tunes it), decided by fgpu sim --learn and,
// with --replay, by the real allocator over a fake API server (test/performance/replay).
// For each size it prints decision p50/p99 and the nodes the core scored per decision
// around 50% and 90% fill; for the replay, the allocator's Sync split into the time in the
// fake API server and the rest, informer sync and first decision, and memory.
//
//	go run ./test/performance/cmd/scale-bench --nodes ../shared/traces/openb/openb_node_list_gpu_node.csv \
//	  --pods ../shared/traces/openb/openb_pod_list_default.csv --replicate 1,2,4,9 [--replay]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/sim"
	"github.com/fgpu-dev/fgpu/test/performance/replay"
)

// bands are the fills reported: decisions made while the allocation ratio was in [lo, hi).
var bands = []struct {
	name   string
	lo, hi float64
}{{"~50%", 0.45, 0.55}, {"~90%", 0.85, 0.95}}

func main() {
	nodesPath := flag.String("nodes", "", "openb node list CSV")
	podsPath := flag.String("pods", "", "openb pod list CSV")
	seed := flag.Int64("seed", 42, "arrival order seed (as fgpu sim's)")
	tune := flag.Float64("tune", 1.3, "arrived GPU demand at the end, a multiple of GPU capacity")
	reps := flag.String("replicate", "1,2,4,9", "copies of the node list per size (9 makes 10,917 nodes)")
	withReplay := flag.Bool("replay", false, "also drive the real allocator (slow: it writes every claim to a fake API server)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	heapProfile := flag.String("heapprofile", "", "write the heap in use at the end of the last replay to this file (go tool pprof)")
	flag.Parse()
	if *nodesPath == "" || *podsPath == "" {
		fmt.Fprintln(os.Stderr, "--nodes and --pods are required")
		os.Exit(2)
	}
	if err := withProfile(*cpuProfile, func() error { return run(*nodesPath, *podsPath, *seed, *tune, *reps, *withReplay, *heapProfile) }); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// withProfile runs f with a CPU profile written to path (none where path is empty).
func withProfile(path string, f func() error) error {
	if path == "" {
		return f()
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := pprof.StartCPUProfile(out); err != nil {
		return err
	}
	defer pprof.StopCPUProfile()
	return f()
}

func run(nodesPath, podsPath string, seed int64, tune float64, reps string, withReplay bool, heapProfile string) error {
	base, err := sim.LoadNodes(nodesPath)
	if err != nil {
		return err
	}
	pods, err := sim.LoadPods(podsPath)
	if err != nil {
		return err
	}
	pods = replay.GPUPods(pods)
	for _, f := range strings.Split(reps, ",") {
		k, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || k < 1 {
			return fmt.Errorf("--replicate: %q is not a positive count", f)
		}
		nodes := sim.Replicate(base, k)
		gpus := 0
		for _, n := range nodes {
			gpus += len(n.GPUs)
		}
		lo := placement.DefaultLearnOptions()
		t0 := time.Now()
		res, err := sim.Run(sim.Config{Nodes: nodes, Pods: pods, Policy: "fgpu", Seed: seed, Tune: tune, Learn: &lo, Parallel: 1})
		if err != nil {
			return err
		}
		fmt.Printf("%d nodes, %d GPUs, %d GPU pods arrived: fgpu sim --learn %.2f%% in %.1f s, the policy rebuilt %d times\n",
			len(nodes), gpus, len(res.Decisions), 100*res.Final.Alloc, time.Since(t0).Seconds(), res.Rebuilds)
		for _, b := range bands {
			var d []time.Duration
			var sc []int32
			for i, f := range res.Fill {
				if f >= b.lo && f < b.hi {
					d = append(d, res.Decisions[i])
					sc = append(sc, res.Scored[i])
				}
			}
			fmt.Printf("  sim    fill %s: decision %s; nodes scored %s\n", b.name, pct(d), pctN(sc))
		}
		if withReplay {
			if err := replayAt(nodes, pods, seed, tune, heapProfile); err != nil {
				return err
			}
		}
	}
	return nil
}

// replayAt drives the allocator until 95% fill (the last band's end): the decisions the
// bands need, without the slow saturated tail.
func replayAt(nodes []placement.NodeSpec, pods []placement.Request, seed int64, tune float64, heapProfile string) error {
	var fills []float64
	for _, b := range bands {
		fills = append(fills, b.lo, b.hi)
	}
	t0 := time.Now()
	rep, err := replay.Run(context.Background(), replay.Config{Nodes: nodes, Pods: pods, Seed: seed, Tune: tune, Fills: fills, Until: bands[len(bands)-1].hi,
		HeapProfile: heapProfile, Memory: true})
	if err != nil {
		return err
	}
	fmt.Printf("  replay %d claims in %.1f s to %.2f%%; informer sync %s, first decision %s after start; invariant %v\n",
		rep.Arrived, time.Since(t0).Seconds(), 100*rep.Alloc, rep.Sync.Round(time.Millisecond), rep.First.Round(time.Millisecond), errText(rep.Invariant))
	for i, b := range bands {
		k := 2*i + 1 // the band between fills[2i] and fills[2i+1]
		own := make([]time.Duration, len(rep.Decisions[k]))
		for j, d := range rep.Decisions[k] {
			own[j] = d - rep.API[k][j]
		}
		fmt.Printf("  replay fill %s: Sync %s; of it in the fake API server %s; the allocator's own %s\n", b.name, pct(rep.Decisions[k]), pct(rep.API[k]), pct(own))
	}
	fmt.Printf("  garbage collections %d, their CPU %.1f s of the process's %.1f s over the claims (runtime/metrics' estimate)\n",
		rep.GCCycles, rep.GCCPU.Seconds(), rep.CPU.Seconds())
	fmt.Printf("  live heap at the end %.0f MiB (allocator and fake API server), the allocator's part %.0f MiB; peak RSS %s (allocator, fake API server and simulator in one process)\n",
		float64(rep.LiveHeap)/(1<<20), float64(rep.AllocatorHeap)/(1<<20), replay.PeakRSS())
	return nil
}

func pct(d []time.Duration) string {
	if len(d) == 0 {
		return "none"
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return fmt.Sprintf("n %d p50 %s p99 %s max %s", len(s), at(0.5).Round(time.Microsecond), at(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}

func pctN(v []int32) string {
	if len(v) == 0 {
		return "none"
	}
	s := slices.Clone(v)
	slices.Sort(s)
	var sum int64
	for _, x := range s {
		sum += int64(x)
	}
	return fmt.Sprintf("mean %.0f p99 %d max %d", float64(sum)/float64(len(s)), s[min(len(s)-1, len(s)*99/100)], s[len(s)-1])
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
