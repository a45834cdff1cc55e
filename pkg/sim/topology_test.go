package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/fgpu-dev/fgpu/pkg/placement"
)

func gpuNode(model string, gpus int) placement.NodeSpec {
	n := placement.NodeSpec{Name: "n", CPUMilli: 96000, MemoryMiB: 393216}
	for range gpus {
		n.GPUs = append(n.GPUs, placement.GPUSpec{Model: model})
	}
	return n
}

// Every node shape of the openb node list has a wiring, and it is the one
// docs/placement.md states.
func TestTopologyOfOpenbShapes(t *testing.T) {
	for _, tc := range []struct {
		model            string
		gpus             int
		island, rootSize int
	}{
		{"A10", 1, 0, 1},
		{"P100", 1, 0, 1},
		{"V100M16", 1, 0, 1},
		{"P100", 2, 0, 2},
		{"T4", 2, 0, 2},
		{"T4", 4, 0, 2},
		{"V100M16", 4, 4, 4},
		{"V100M32", 4, 4, 4},
		{"G2", 8, 4, 4},
		{"G3", 8, 4, 4},
		{"V100M16", 8, 4, 4},
		{"V100M32", 8, 4, 4},
	} {
		got := topologyOf(gpuNode(tc.model, tc.gpus))
		if want := (Topology{IslandSize: tc.island, RootSize: tc.rootSize}); got != want {
			t.Errorf("%dx%s: %+v, want %+v", tc.gpus, tc.model, got, want)
		}
	}
	mixed := gpuNode("T4", 2)
	mixed.GPUs[1].Model = "P100"
	for name, n := range map[string]placement.NodeSpec{"unknown model": gpuNode("B200", 8), "mixed": mixed, "no GPU": {}} {
		if got := topologyOf(n); got != (Topology{}) {
			t.Errorf("%s: %+v, want unknown", name, got)
		}
	}
}

// A placement is local when its GPUs lie in one block, and it had room when
// one block held enough usable GPUs, its own included.
func TestLocalityOfPlacement(t *testing.T) {
	dgx := Topology{IslandSize: 4, RootSize: 4}
	t4 := Topology{RootSize: 2}
	for _, tc := range []struct {
		name  string
		topo  Topology
		size  int // the node's GPUs
		gpus  []int
		taken []int // GPUs already whole-used by other pods
		want  Locality
	}{
		{"4 GPUs on 0-3 of an empty 8xV100", dgx, 8, []int{0, 1, 2, 3}, nil, Locality{1, 1, 1, 1, 1}},
		{"4 GPUs on 2-5 of an empty 8xV100", dgx, 8, []int{2, 3, 4, 5}, nil, Locality{1, 1, 0, 1, 0}},
		{"4 GPUs on 2-5, 0 and 6 taken: no quad had room", dgx, 8, []int{2, 3, 4, 5}, []int{0, 6}, Locality{1, 0, 0, 0, 0}},
		{"8 GPUs never fit an island", dgx, 8, []int{0, 1, 2, 3, 4, 5, 6, 7}, nil, Locality{Pods: 1}},
		{"2 GPUs on one socket of a 4xT4", t4, 4, []int{2, 3}, nil, Locality{Pods: 1, RootRoom: 1, InRoot: 1}},
		{"2 GPUs across sockets, 0 and 3 taken", t4, 4, []int{1, 2}, []int{0, 3}, Locality{Pods: 1}},
		{"unknown wiring", Topology{}, 2, []int{0, 1}, nil, Locality{Pods: 1}},
		{"one GPU is not counted", dgx, 8, []int{0}, nil, Locality{}},
	} {
		free := make([]int64, tc.size)
		for g := range free {
			free[g] = 1000
		}
		share := make([]int64, len(tc.gpus))
		for i, g := range tc.gpus {
			free[g], share[i] = 0, 1000
		}
		for _, g := range tc.taken {
			free[g] = 0
		}
		var l Locality
		l.add(tc.topo, placement.Placement{GPUs: tc.gpus, Share: share}, free)
		if l != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, l, tc.want)
		}
	}
}

// A replay counts its multi-GPU pods' locality, and the summary's JSON
// carries it beside the allocation ratio.
func TestLocalityReported(t *testing.T) {
	nodes, err := ReadNodes(strings.NewReader(nodesCSV))
	if err != nil {
		t.Fatal(err)
	}
	pods, err := ReadPods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n" +
		"two,1000,1024,2,1000\nfour,1000,1024,4,1000\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Nodes: nodes, Pods: pods, Policy: "fgpu", Tune: 1}
	sum, results, err := RunSeeds(cfg, []int64{1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := results[0].Locality; l.Pods != results[0].Placed || l.IslandRoom == 0 || l.RootRoom == 0 {
		t.Errorf("locality %+v for %d placed multi-GPU pods", l, results[0].Placed)
	}
	b, err := json.Marshal(sum)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	var loc map[string]float64
	if err := json.Unmarshal(raw["multi_gpu_locality"], &loc); err != nil {
		t.Fatalf("multi_gpu_locality: %v in %s", err, b)
	}
	for _, k := range []string{"placed", "island_room", "in_one_island", "in_one_island_pct", "pcie_root_room", "in_one_pcie_root", "in_one_pcie_root_pct"} {
		if _, ok := loc[k]; !ok {
			t.Errorf("multi_gpu_locality lacks %q: %s", k, raw["multi_gpu_locality"])
		}
	}
	if _, ok := raw["gpu_alloc_ratio_at_130"]; !ok {
		t.Error("allocation ratio missing from the JSON")
	}
}

// The policy sees the model's wiring in the nodes' specs (NUMA as the PCIe
// root), wiring a spec names is kept, and a blind replay's specs name none.
func TestWireGivesTheModel(t *testing.T) {
	nvswitch := gpuNode("G2", 8)
	for g := range nvswitch.GPUs {
		nvswitch.GPUs[g].Island = "all"
	}
	nodes := []placement.NodeSpec{gpuNode("G2", 8), gpuNode("T4", 4), gpuNode("B200", 8), nvswitch}
	island := func(n placement.NodeSpec) (s []string) {
		for _, g := range n.GPUs {
			s = append(s, g.Island+"/"+g.PCIeRoot+"/"+g.NUMA)
		}
		return s
	}
	got := wire(nodes, false)
	for i, want := range [][]string{
		{"0/0/0", "0/0/0", "0/0/0", "0/0/0", "1/1/1", "1/1/1", "1/1/1", "1/1/1"},
		{"/0/0", "/0/0", "/1/1", "/1/1"},
		{"//", "//", "//", "//", "//", "//", "//", "//"},
		{"all//", "all//", "all//", "all//", "all//", "all//", "all//", "all//"},
	} {
		if s := island(got[i]); strings.Join(s, " ") != strings.Join(want, " ") {
			t.Errorf("node %d wired %v, want %v", i, s, want)
		}
	}
	if nodes[0].GPUs[0].Island != "" {
		t.Error("wire changed the caller's specs")
	}
	for i, n := range wire(nodes, true) {
		if named(n) {
			t.Errorf("blind node %d names wiring: %v", i, island(n))
		}
	}
}

// On openb, fgpu with the wiring keeps every multi-GPU pod that one island
// (root) could hold inside one, and places exactly as the blind policy does
// otherwise: it chooses only among GPUs its score finds alike.
func TestWiringKeepsPodsLocalAtNoCost(t *testing.T) {
	dir, nodes, _ := openb(t)
	pods, err := LoadPods(dir + "openb_pod_list_multigpu40.csv")
	if err != nil {
		t.Fatal(err)
	}
	var res [2]*Result
	for i, blind := range []bool{false, true} {
		if res[i], err = Run(Config{Nodes: nodes, Pods: pods, Policy: "fgpu", Seed: 42, Tune: 1.3, TopologyBlind: blind}); err != nil {
			t.Fatal(err)
		}
	}
	wired, blind := res[0], res[1]
	if wired.Final != blind.Final || wired.Failed != blind.Failed {
		t.Errorf("wired: %+v, failed %v; blind: %+v, failed %v", wired.Final, wired.Failed, blind.Final, blind.Failed)
	}
	l := wired.Locality
	t.Logf("wired %+v, blind %+v", l, blind.Locality)
	if l.InIsland != l.IslandRoom || l.InRoot != l.RootRoom {
		t.Errorf("wired: %d of %d pods in one island, %d of %d under one root; want all", l.InIsland, l.IslandRoom, l.InRoot, l.RootRoom)
	}
	if blind.Locality.InIsland >= blind.Locality.IslandRoom {
		t.Errorf("blind: %d of %d pods in one island; the test no longer tells the two apart", blind.Locality.InIsland, blind.Locality.IslandRoom)
	}
}
