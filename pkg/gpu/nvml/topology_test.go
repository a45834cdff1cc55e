//go:build cgo

package nvml

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/cpuset"
)

// dgxH100Topology answers the topology queries as a DGX H100's GPU does: its 18 NVLinks
// active, each to one of the four NVSwitches; registered with a fabric of one node (no
// cluster UUID); nearest to the CPUs of its socket, a 56-core Xeon with two threads a core.
func dgxH100Topology(d *server.Device, numa int) {
	d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
		if link >= 18 {
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
	}
	d.GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
		return gonvml.NVLINK_DEVICE_TYPE_SWITCH, gonvml.SUCCESS
	}
	d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
		return pciInfo(fmt.Sprintf("00000000:%02X:00.0", 5+link%4)), gonvml.SUCCESS
	}
	d.GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) {
		return gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.SUCCESS)}, gonvml.SUCCESS
	}
	cpus := dgxH100CPUs(numa)
	d.GetCpuAffinityFunc = func(n int) ([]uint, gonvml.Return) { return cpuMask(n, cpus.List()...), gonvml.SUCCESS }
}

func dgxH100CPUs(numa int) cpuset.CPUSet {
	return cpuset.New().Union(rangeSet(numa*56, numa*56+55), rangeSet(112+numa*56, 112+numa*56+55))
}

func rangeSet(from, to int) cpuset.CPUSet {
	var cpus []int
	for c := from; c <= to; c++ {
		cpus = append(cpus, c)
	}
	return cpuset.New(cpus...)
}

// cpuMask is the mask NVML fills in for n CPUs: go-nvml sizes it at a word per 8 CPUs.
func cpuMask(n int, cpus ...int) []uint {
	mask := make([]uint, (n-1)/8+1)
	for _, c := range cpus {
		mask[c/64] |= 1 << (c % 64)
	}
	return mask
}

func pciInfo(busID string) gonvml.PciInfo {
	var p gonvml.PciInfo
	for i, c := range []byte(busID) {
		p.BusId[i] = int8(c)
	}
	return p
}

// dgxH100Root is the PCIe root of the mock's GPU i: one per socket.
func dgxH100Root(i int) string { return []string{"pci0000:00", "pci0000:1f"}[i/4] }

// fakeSysfs lays out the links sysfs has for the mock's GPUs: /sys/bus/pci/devices/<bus id>
// to the device under its root and a bridge.
func fakeSysfs(t *testing.T, s *server.Server) string {
	t.Helper()
	root := t.TempDir()
	bus := filepath.Join(root, "bus", "pci", "devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		t.Fatal(err)
	}
	for i := range s.Devices {
		id := mockDevice(t, s, i).PciBusID
		target := filepath.Join("..", "..", "..", "devices", dgxH100Root(i), "0000:00:01.0", id)
		if err := os.Symlink(target, filepath.Join(bus, id)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Where a link of wire's table leads other than to a GPU of the node.
const (
	toSwitch = -1 - iota
	toCPU    // an IBM NPU
	linkDown
)

// wire replaces the mock's NVLinks: links[i] lists where GPU i's links lead, in link order
// (a GPU index, toSwitch, toCPU or linkDown). A GPU not in links has no NVLink. Untyped, the
// driver does not say what a link leads to.
func wire(t *testing.T, s *server.Server, typed bool, links map[int][]int) {
	t.Helper()
	for i := range s.Devices {
		d, far := mockDevice(t, s, i), links[i]
		d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			switch {
			case far == nil:
				return 0, gonvml.ERROR_NOT_SUPPORTED
			case link >= len(far):
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			case far[link] == linkDown:
				return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(link int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			if !typed {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			switch far[link] {
			case toSwitch:
				return gonvml.NVLINK_DEVICE_TYPE_SWITCH, gonvml.SUCCESS
			case toCPU:
				return gonvml.NVLINK_DEVICE_TYPE_IBMNPU, gonvml.SUCCESS
			}
			return gonvml.NVLINK_DEVICE_TYPE_GPU, gonvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			switch far[link] {
			case toSwitch:
				return pciInfo("00000000:05:00.0"), gonvml.SUCCESS
			case toCPU:
				return pciInfo("00000000:04:00.0"), gonvml.SUCCESS
			}
			return pciInfo(strings.ToUpper("0000" + mockDevice(t, s, far[link]).PciBusID)), gonvml.SUCCESS
		}
	}
}

// meshes links every GPU of each group to every other one of it, twice.
func meshes(groups ...[]int) map[int][]int {
	links := map[int][]int{}
	for _, g := range groups {
		for _, i := range g {
			for _, j := range g {
				if i != j {
					links[i] = append(links[i], j, j)
				}
			}
		}
	}
	return links
}

func islands(t *testing.T, b *Backend) []string {
	t.Helper()
	devs, err := b.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	var out []string
	for _, d := range devs {
		out = append(out, d.NVLinkIsland)
	}
	return out
}

func TestNVLinkIslands(t *testing.T) {
	everyGPU := func(far ...int) map[int][]int {
		links := map[int][]int{}
		for i := range 8 {
			links[i] = far
		}
		return links
	}
	four, none := "nvl-4", ""
	for _, tc := range []struct {
		name  string
		typed bool
		links map[int][]int
		want  []string
	}{
		{"two islands of four, direct", true, meshes([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}),
			[]string{"nvl-0", "nvl-0", "nvl-0", "nvl-0", four, four, four, four}},
		{"two islands of four, far ends found by PCI bus id", false, meshes([]int{0, 1, 2, 3}, []int{4, 5, 6, 7}),
			[]string{"nvl-0", "nvl-0", "nvl-0", "nvl-0", four, four, four, four}},
		{"NVSwitch joins all", true, everyGPU(toSwitch, toSwitch, linkDown),
			[]string{"nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0"}},
		{"NVSwitch found by PCI bus id: not one of the node's GPUs", false, everyGPU(toSwitch),
			[]string{"nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0"}},
		{"PCIe only", true, nil, []string{none, none, none, none, none, none, none, none}},
		{"a chain is one island", true, map[int][]int{2: {3}, 3: {2, 6}, 6: {3}},
			[]string{none, none, "nvl-2", "nvl-2", none, none, "nvl-2", none}},
		{"links down join nothing", true, map[int][]int{0: {linkDown}, 1: {linkDown}}, []string{none, none, none, none, none, none, none, none}},
		{"a CPU's NVLink joins nothing", true, everyGPU(toCPU), []string{none, none, none, none, none, none, none, none}},
		{"a GPU alone on a switch is in no island", true, map[int][]int{5: {toSwitch}}, []string{none, none, none, none, none, none, none, none}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMock(t)
			wire(t, s, tc.typed, tc.links)
			if got := islands(t, newBackend(t, s)); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("islands %q, want %q", got, tc.want)
			}
		})
	}
}

// A far end NVML types as unknown is told by its PCI bus id, as an untyped one is.
func TestNVLinkFarEndOfUnknownType(t *testing.T) {
	s := newMock(t)
	for i := range s.Devices {
		mockDevice(t, s, i).GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			return gonvml.NVLINK_DEVICE_TYPE_UNKNOWN, gonvml.SUCCESS
		}
	}
	want := []string{"nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0", "nvl-0"}
	if got := islands(t, newBackend(t, s)); !reflect.DeepEqual(got, want) {
		t.Errorf("islands %q, want %q", got, want)
	}
}

// loggedFor counts the "not published" lines about an attribute.
func loggedFor(t *testing.T, logger klog.Logger, attribute string) int {
	t.Helper()
	u, ok := logger.GetSink().(ktesting.Underlier)
	if !ok {
		t.Fatal("not a ktesting logger")
	}
	n := 0
	for _, e := range u.GetBuffer().Data() {
		if e.Message == "GPU attribute not published" && reflect.DeepEqual(e.ParameterKVList[4:6], []any{"attribute", attribute}) {
			n++
		}
	}
	return n
}

func testLogger(t *testing.T) klog.Logger {
	return ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
}

// A GPU whose own link queries fail is left out of the islands, said once; Devices goes on.
func TestNVLinkFailureLeavesTheGPUOut(t *testing.T) {
	s := newMock(t)
	mockDevice(t, s, 2).GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
	logger := testLogger(t)
	b := newBackend(t, s, WithLogger(logger))
	for range 2 {
		if got := islands(t, b); got[2] != "" || got[1] != "nvl-0" || got[3] != "nvl-0" {
			t.Fatalf("islands %q: want gpu-2 in none, the others in nvl-0", got)
		}
	}
	if n := loggedFor(t, logger, "nvlinkIsland"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
}

func TestFabricClique(t *testing.T) {
	cluster := [16]uint8{0x8f, 0x1c, 0x3a, 0x52, 0x6d, 0x0e, 0x5b, 0x47, 0x9a, 0x21, 0x3e, 0x5f, 0x7c, 0x9d, 0x0b, 0x14}
	ok := uint32(gonvml.SUCCESS)
	for _, tc := range []struct {
		name   string
		info   gonvml.GpuFabricInfo
		ret    gonvml.Return
		want   string
		logged int
	}{
		{"registered", gonvml.GpuFabricInfo{ClusterUuid: cluster, CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: ok}, gonvml.SUCCESS,
			"8f1c3a52-6d0e-5b47-9a21-3e5f7c9d0b14.7", 0},
		{"one node, no cluster", gonvml.GpuFabricInfo{CliqueId: 7, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: ok}, gonvml.SUCCESS, "", 0},
		{"still registering", gonvml.GpuFabricInfo{ClusterUuid: cluster, State: gonvml.GPU_FABRIC_STATE_IN_PROGRESS}, gonvml.SUCCESS, "", 1},
		{"registration failed", gonvml.GpuFabricInfo{ClusterUuid: cluster, State: gonvml.GPU_FABRIC_STATE_COMPLETED, Status: uint32(gonvml.ERROR_TIMEOUT)}, gonvml.SUCCESS, "", 1},
		{"no fabric on this GPU", gonvml.GpuFabricInfo{State: gonvml.GPU_FABRIC_STATE_NOT_SUPPORTED}, gonvml.SUCCESS, "", 0},
		{"query not supported", gonvml.GpuFabricInfo{}, gonvml.ERROR_NOT_SUPPORTED, "", 0},
		{"driver without the query", gonvml.GpuFabricInfo{}, gonvml.ERROR_FUNCTION_NOT_FOUND, "", 0},
		{"query failed", gonvml.GpuFabricInfo{}, gonvml.ERROR_UNKNOWN, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMock(t)
			mockDevice(t, s, 6).GetGpuFabricInfoFunc = func() (gonvml.GpuFabricInfo, gonvml.Return) { return tc.info, tc.ret }
			logger := testLogger(t)
			b := newBackend(t, s, WithLogger(logger))
			devs, err := b.Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if devs[6].FabricClique != tc.want || devs[5].FabricClique != "" {
				t.Errorf("gpu-6 clique %q, want %q; gpu-5 %q, want none", devs[6].FabricClique, tc.want, devs[5].FabricClique)
			}
			if n := loggedFor(t, logger, "fabricClique"); n != tc.logged {
				t.Errorf("logged %d times, want %d", n, tc.logged)
			}
		})
	}
}

func TestCPUAffinity(t *testing.T) {
	var everyOther []int
	for c := 0; c < 256; c += 2 {
		everyOther = append(everyOther, c)
	}
	for _, tc := range []struct {
		name   string
		mask   func(n int) ([]uint, gonvml.Return)
		want   string
		logged int
	}{
		{"across words", func(n int) ([]uint, gonvml.Return) {
			return cpuMask(n, 0, 1, 2, 3, 62, 63, 64, 65, 200), gonvml.SUCCESS
		}, "0-3,62-65,200", 0},
		{"empty", func(n int) ([]uint, gonvml.Return) { return cpuMask(n), gonvml.SUCCESS }, "", 0},
		{"too long for an attribute", func(n int) ([]uint, gonvml.Return) { return cpuMask(n, everyOther...), gonvml.SUCCESS }, "", 1},
		{"not supported", func(int) ([]uint, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }, "", 0},
		{"failed", func(int) ([]uint, gonvml.Return) { return nil, gonvml.ERROR_UNKNOWN }, "", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMock(t)
			mockDevice(t, s, 1).GetCpuAffinityFunc = tc.mask
			logger := testLogger(t)
			devs, err := newBackend(t, s, WithLogger(logger)).Devices()
			if err != nil {
				t.Fatalf("Devices: %v", err)
			}
			if devs[1].CPUAffinity != tc.want || devs[0].CPUAffinity != "0-55,112-167" {
				t.Errorf("gpu-1 CPUs %q, want %q; gpu-0 %q", devs[1].CPUAffinity, tc.want, devs[0].CPUAffinity)
			}
			if n := loggedFor(t, logger, "cpuAffinity"); n != tc.logged {
				t.Errorf("logged %d times, want %d", n, tc.logged)
			}
		})
	}
}

// Without the sysfs links no GPU has a PCIe root, and each says so once; Devices goes on.
func TestPCIeRootUnreadable(t *testing.T) {
	logger := testLogger(t)
	b := newBackend(t, newMock(t), WithSysfsRoot(t.TempDir()), WithLogger(logger))
	for range 2 {
		devs, err := b.Devices()
		if err != nil {
			t.Fatalf("Devices: %v", err)
		}
		for _, d := range devs {
			if d.PCIeRoot != "" {
				t.Errorf("gpu-%d root %q from an empty sysfs", d.Index, d.PCIeRoot)
			}
		}
	}
	if n := loggedFor(t, logger, "pcieRoot"); n != 8 {
		t.Errorf("logged %d times, want once per GPU (8)", n)
	}
}

// Devices runs on every compute mode check of a prepare: the wiring is read once, and the
// next calls give the same place without asking NVML again.
func TestWiringIsReadOnce(t *testing.T) {
	s := newMock(t)
	calls := 0
	mockDevice(t, s, 1).GetCpuAffinityFunc = func(n int) ([]uint, gonvml.Return) { calls++; return cpuMask(n, 4, 5), gonvml.SUCCESS }
	b := newBackend(t, s)
	for range 3 {
		devs, err := b.Devices()
		if err != nil {
			t.Fatalf("Devices: %v", err)
		}
		if devs[1].CPUAffinity != "4-5" {
			t.Fatalf("gpu-1 CPUs %q, want 4-5", devs[1].CPUAffinity)
		}
	}
	if calls != 1 {
		t.Errorf("CPU affinity asked %d times over three Devices, want once", calls)
	}
}
