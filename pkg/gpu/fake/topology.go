package fake

import (
	"fmt"
	"regexp"
	"strconv"

	"k8s.io/utils/cpuset"
)

// A fake node's wiring is a preset <kind>-<roots>x<gpus>: its GPUs, in index order, fill
// <roots> PCIe root complexes of <gpus> each, every root under a CPU socket of its own (NUMA
// node r, 32 cores with two threads each). The kinds say what NVLink joins:
//
//	pcie      nothing: PCIe cards (pcie-2x2: four cards, two per socket)
//	nvlink    each root's GPUs are one NVLink island (nvlink-2x4: two 4-GPU boards)
//	nvswitch  all the node's GPUs are one island through NVSwitches (nvswitch-2x4: a DGX H100)
//	fabric    as nvswitch, and the GPUs are in a multi-node NVLink fabric (fabric-2x2: a
//	          GB200 NVL72 tray); every fake node is in the same clique, FabricClique
//
// Without a preset a node is pcie-1x<its GPUs>: one root, pci0000:00, and NUMA node 0.
const (
	topologyPCIe     = "pcie"
	topologyNVLink   = "nvlink"
	topologyNVSwitch = "nvswitch"
	topologyFabric   = "fabric"
)

// FabricClique is the fabric clique of the GPUs of a fabric preset: one made-up cluster, so
// that the fake nodes look like trays of one rack.
const FabricClique = "8f1c3a52-6d0e-5b47-9a21-3e5f7c9d0b14.1"

const (
	maxRoots       = 8
	coresPerSocket = 32
)

var topologyRE = regexp.MustCompile(`^(pcie|nvlink|nvswitch|fabric)-(\d+)x(\d+)$`)

type topology struct {
	kind           string
	roots, perRoot int
}

// parseTopology reads a preset and checks that it wires exactly n GPUs.
func parseTopology(preset string, n int) (topology, error) {
	if preset == "" {
		return topology{kind: topologyPCIe, roots: 1, perRoot: n}, nil
	}
	m := topologyRE.FindStringSubmatch(preset)
	if m == nil {
		return topology{}, fmt.Errorf("fake GPU topology %q: want <kind>-<roots>x<gpus per root> with kind pcie, nvlink, nvswitch or fabric, e.g. nvlink-2x4", preset)
	}
	roots, _ := strconv.Atoi(m[2])
	perRoot, _ := strconv.Atoi(m[3])
	if roots < 1 || roots > maxRoots || perRoot < 1 {
		return topology{}, fmt.Errorf("fake GPU topology %q: want 1-%d roots of at least one GPU", preset, maxRoots)
	}
	if roots*perRoot != n {
		return topology{}, fmt.Errorf("fake GPU topology %q wires %d GPUs (%d roots of %d), but the fleet has %d", preset, roots*perRoot, roots, perRoot, n)
	}
	return topology{kind: m[1], roots: roots, perRoot: perRoot}, nil
}

// place is where the GPU at index i sits: its PCI bus id under its root, its root, NUMA
// node, nearest CPUs, NVLink island and fabric clique.
type place struct {
	busID, root, island, clique, cpus string
	numa                              int
}

func (t topology) place(i int) place {
	r, j := i/t.perRoot, i%t.perRoot
	// Each root owns an equal share of the 256 buses, named by its first; its GPUs sit from
	// 0x18 buses in, 0x10 apart (closer where many share a root), so that a GPU's bus id
	// falls in its root's range as on a real host.
	span := 0x100 / t.roots
	base := r * span
	step := min(0x10, (span-0x18)/t.perRoot)
	p := place{
		busID: fmt.Sprintf("0000:%02x:00.0", base+0x18+j*step),
		root:  fmt.Sprintf("pci0000:%02x", base),
		numa:  r,
		cpus:  socketCPUs(r, t.roots),
	}
	// An island is named by its lowest GPU index, as the NVML backend names it; a GPU
	// alone is in none.
	switch {
	case t.kind == topologyNVLink && t.perRoot > 1:
		p.island = fmt.Sprintf("nvl-%d", r*t.perRoot)
	case (t.kind == topologyNVSwitch || t.kind == topologyFabric) && t.roots*t.perRoot > 1:
		p.island = "nvl-0"
	}
	if t.kind == topologyFabric {
		p.clique = FabricClique
	}
	return p
}

// socketCPUs lists socket s's CPUs on a node of n sockets numbered as Linux does: first
// every core's first thread, socket by socket, then every core's second.
func socketCPUs(s, n int) string {
	var cpus []int
	for _, first := range []int{s * coresPerSocket, (n + s) * coresPerSocket} {
		for c := first; c < first+coresPerSocket; c++ {
			cpus = append(cpus, c)
		}
	}
	return cpuset.New(cpus...).String()
}
