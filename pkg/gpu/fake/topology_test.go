package fake

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestTopologyPresets(t *testing.T) {
	const socket0, socket1 = "0-31,64-95", "32-63,96-127"
	for _, tc := range []struct {
		preset string
		n      int
		want   []place
	}{
		{"", 2, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: "0-63"},
			{busID: "0000:28:00.0", root: "pci0000:00", cpus: "0-63"},
		}},
		{"nvlink-2x4", 8, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0"},
			{busID: "0000:28:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0"},
			{busID: "0000:38:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0"},
			{busID: "0000:48:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0"},
			{busID: "0000:98:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-4", numa: 1},
			{busID: "0000:a8:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-4", numa: 1},
			{busID: "0000:b8:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-4", numa: 1},
			{busID: "0000:c8:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-4", numa: 1},
		}},
		{"pcie-2x2", 4, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: socket0},
			{busID: "0000:28:00.0", root: "pci0000:00", cpus: socket0},
			{busID: "0000:98:00.0", root: "pci0000:80", cpus: socket1, numa: 1},
			{busID: "0000:a8:00.0", root: "pci0000:80", cpus: socket1, numa: 1},
		}},
		{"nvswitch-2x1", 2, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0"},
			{busID: "0000:98:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-0", numa: 1},
		}},
		{"fabric-2x1", 2, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: socket0, island: "nvl-0", clique: FabricClique},
			{busID: "0000:98:00.0", root: "pci0000:80", cpus: socket1, island: "nvl-0", clique: FabricClique, numa: 1},
		}},
		// Islands of one are none.
		{"nvlink-2x1", 2, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: socket0},
			{busID: "0000:98:00.0", root: "pci0000:80", cpus: socket1, numa: 1},
		}},
		{"fabric-1x1", 1, []place{
			{busID: "0000:18:00.0", root: "pci0000:00", cpus: "0-63", clique: FabricClique},
		}},
	} {
		topo, err := parseTopology(tc.preset, tc.n)
		if err != nil {
			t.Fatalf("%q: %v", tc.preset, err)
		}
		for i, want := range tc.want {
			if got := topo.place(i); got != want {
				t.Errorf("%q GPU %d:\n got %+v\nwant %+v", tc.preset, i, got, want)
			}
		}
	}
}

func TestTopologyRefusals(t *testing.T) {
	for _, tc := range []struct {
		preset string
		n      int
		want   string
	}{
		{"nvlink-2x4", 6, "wires 8 GPUs (2 roots of 4), but the fleet has 6"},
		{"pcie-2x2", 8, "wires 4 GPUs"},
		{"ring-2x4", 8, "want <kind>-<roots>x<gpus per root>"},
		{"nvlink-2", 2, "want <kind>-<roots>x<gpus per root>"},
		{"nvlink-0x4", 0, "want 1-8 roots"},
		{"pcie-16x1", 16, "want 1-8 roots"},
		{"nvlink-2x0", 0, "want 1-8 roots of at least one GPU"},
	} {
		if _, err := parseTopology(tc.preset, tc.n); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q on %d GPUs: err %v, want one saying %q", tc.preset, tc.n, err, tc.want)
		}
	}
}

// Every preset a node of up to 64 GPUs can take puts each GPU on a bus of its own, inside
// its root's range.
func TestTopologyBusesFallUnderTheirRoots(t *testing.T) {
	for roots := 1; roots <= maxRoots; roots++ {
		for per := 1; roots*per <= 64; per++ {
			topo, err := parseTopology(fmt.Sprintf("pcie-%dx%d", roots, per), roots*per)
			if err != nil {
				t.Fatal(err)
			}
			seen := map[string]bool{}
			for i := range roots * per {
				p := topo.place(i)
				var bus, root int
				if _, err := fmt.Sscanf(p.busID, "0000:%x:00.0", &bus); err != nil {
					t.Fatalf("%dx%d GPU %d: bus id %q: %v", roots, per, i, p.busID, err)
				}
				if _, err := fmt.Sscanf(p.root, "pci0000:%x", &root); err != nil {
					t.Fatalf("%dx%d GPU %d: root %q: %v", roots, per, i, p.root, err)
				}
				if bus > 0xff || bus < root || bus >= root+0x100/roots || seen[p.busID] {
					t.Fatalf("%dx%d GPU %d: bus id %s outside root %s's buses or taken twice", roots, per, i, p.busID, p.root)
				}
				seen[p.busID] = true
			}
		}
	}
}

func TestParseSpecTopology(t *testing.T) {
	f, err := ParseSpec("4xH100-80GB,4xA100-80GB/nvlink-2x4")
	if err != nil || f.Topology != "nvlink-2x4" || len(f.GPUs) != 2 || f.GPUs[1] != (FleetGPU{"A100-80GB", 4}) {
		t.Fatalf("got %+v, %v", f, err)
	}
	for spec, want := range map[string]string{
		"8xH100-80GB/":              "no topology after the slash",
		"6xH100-80GB/nvlink-2x4":    "but the fleet has 6",
		"8xH100-80GB/nvlink-2x4/x":  "want <kind>-<roots>x<gpus per root>",
		"8xH100-80GB/nvlink-2x4,1x": "want <kind>-<roots>x<gpus per root>",
	} {
		if _, err := ParseSpec(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseSpec(%q): err %v, want one saying %q", spec, err, want)
		}
	}
}

func TestLoadFleetFileTopology(t *testing.T) {
	p := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(p, []byte("topology: pcie-2x2\ngpus:\n- model: L4-24GB\n  count: 4\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := LoadFleetFile(p)
	if err != nil || f.Topology != "pcie-2x2" {
		t.Fatalf("got %+v, %v", f, err)
	}
}

func TestNewPlacesGPUsByTopology(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("creating device nodes needs root")
	}
	f, err := ParseSpec("8xH100-80GB/nvlink-2x4")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(f, "node-a", t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for i, d := range devs {
		if want := map[bool]string{false: "nvl-0", true: "nvl-4"}[i >= 4]; d.NVLinkIsland != want || d.NUMANode != i/4 || d.PCIeRoot == "" || d.CPUAffinity == "" {
			t.Errorf("gpu-%d: island %q numa %d root %q cpus %q; want island %s, numa %d", i, d.NVLinkIsland, d.NUMANode, d.PCIeRoot, d.CPUAffinity, want, i/4)
		}
	}
	if devs[3].PCIeRoot == devs[4].PCIeRoot {
		t.Errorf("both islands under root %s", devs[3].PCIeRoot)
	}

	f.Topology = "nvlink-2x4"
	f.GPUs[0].Count = 6
	if _, err := New(f, "node-a", t.TempDir(), ""); err == nil || !strings.Contains(err.Error(), "fleet has 6") {
		t.Errorf("6 GPUs wired as nvlink-2x4: err %v", err)
	}
}
