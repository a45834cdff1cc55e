//go:build cgo

package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxh100"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// newMock returns go-nvml's 8×H100 DGX mock with the device calls it leaves
// unset filled in the way a real H100 answers them: a bus id in NVML's own
// "00000000:XX:00.0" upper-case form, NUMA node 0 for GPUs 0-3 and 1 for 4-7,
// a compute mode that SetComputeMode changes, and a DGX H100's topology.
func newMock(t *testing.T) *server.Server {
	t.Helper()
	s := dgxh100.New()
	if len(s.Devices) != 8 {
		t.Fatalf("dgxh100 mock has %d devices, want 8", len(s.Devices))
	}
	for i := range s.Devices {
		d := mockDevice(t, s, i)
		var (
			mu   sync.Mutex
			mode = gonvml.COMPUTEMODE_DEFAULT
		)
		var domain, bus, device, fn uint
		if _, err := fmt.Sscanf(d.PciBusID, "%x:%x:%x.%x", &domain, &bus, &device, &fn); err != nil {
			t.Fatalf("mock bus id %q: %v", d.PciBusID, err)
		}
		// Make the buses distinct from the indexes so a test can tell them apart.
		busID := fmt.Sprintf("%08X:%02X:%02X.%X", domain, bus+0x1b, device, fn)
		d.PciBusID = fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus+0x1b, device, fn)
		orig := d.GetPciInfoFunc
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			p, ret := orig()
			for i := range p.BusId {
				p.BusId[i] = 0
			}
			for i, c := range []byte(busID) {
				p.BusId[i] = int8(c)
			}
			p.Domain, p.Bus, p.Device = uint32(domain), uint32(bus+0x1b), uint32(device)
			return p, ret
		}
		numa := d.Index / 4
		d.GetNumaNodeIdFunc = func() (int, gonvml.Return) { return numa, gonvml.SUCCESS }
		d.GetComputeModeFunc = func() (gonvml.ComputeMode, gonvml.Return) {
			mu.Lock()
			defer mu.Unlock()
			return mode, gonvml.SUCCESS
		}
		d.SetComputeModeFunc = func(m gonvml.ComputeMode) gonvml.Return {
			mu.Lock()
			defer mu.Unlock()
			mode = m
			return gonvml.SUCCESS
		}
		dgxH100Topology(d, numa)
	}
	return s
}

func mockDevice(t *testing.T, s *server.Server, i int) *server.Device {
	t.Helper()
	d, ok := s.Devices[i].(*server.Device)
	if !ok {
		t.Fatalf("mock device %d is a %T, want *server.Device", i, s.Devices[i])
	}
	return d
}

// fakeFS answers the existence check from a set (nil: everything exists) and records what was asked.
type fakeFS struct {
	mu      sync.Mutex
	present map[string]bool
	asked   []string
}

func (f *fakeFS) exists(p string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, p)
	return f.present == nil || f.present[p]
}

func newBackend(t *testing.T, s *server.Server, opts ...Option) *Backend {
	t.Helper()
	fs := &fakeFS{}
	b, err := New(s, append([]Option{WithPathExists(fs.exists), WithSysfsRoot(fakeSysfs(t, s))}, opts...)...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func TestDevicesDGXH100(t *testing.T) {
	s := newMock(t)
	b := newBackend(t, s)

	devs, err := b.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(devs) != 8 {
		t.Fatalf("got %d devices, want 8", len(devs))
	}
	seen := map[string]int{}
	for i, d := range devs {
		m := mockDevice(t, s, i)
		if d.Index != i || d.Name() != fmt.Sprintf("gpu-%d", i) {
			t.Errorf("device %d: Index %d Name %q", i, d.Index, d.Name())
		}
		if d.UUID != m.UUID || !strings.HasPrefix(d.UUID, "GPU-") {
			t.Errorf("device %d: UUID %q, mock has %q", i, d.UUID, m.UUID)
		}
		if j, dup := seen[d.UUID]; dup {
			t.Errorf("devices %d and %d share UUID %q", j, i, d.UUID)
		}
		seen[d.UUID] = i
		want := gpu.Device{
			Index:                 i,
			UUID:                  m.UUID,
			ProductName:           "NVIDIA H100 80GB HBM3",
			Architecture:          "Hopper",
			CUDAComputeCapability: "9.0",
			DriverVersion:         "550.54.15",
			CUDADriverVersion:     "12.4",
			MemoryBytes:           80 << 30,
			Minor:                 i,
			PCIBusID:              fmt.Sprintf("0000:%02x:00.0", 0x1b+i),
			NUMANode:              i / 4,
			ComputeMode:           gpu.ComputeModeDefault,
			PCIeRoot:              dgxH100Root(i),
			NVLinkIsland:          "nvl-0",
			CPUAffinity:           dgxH100CPUs(i / 4).String(),
			DeviceNodes: []string{
				fmt.Sprintf("/dev/nvidia%d", i),
				"/dev/nvidiactl",
				"/dev/nvidia-uvm",
				"/dev/nvidia-uvm-tools",
			},
		}
		if !reflect.DeepEqual(d, want) {
			t.Errorf("device %d:\n got %+v\nwant %+v", i, d, want)
		}
	}
}

func TestDeviceNodesOnlyThoseThatExist(t *testing.T) {
	s := newMock(t)
	root := filepath.Join("/host", "dev")
	fs := &fakeFS{present: map[string]bool{
		"/host/dev/nvidia2":    true,
		"/host/dev/nvidiactl":  true,
		"/host/dev/nvidia-uvm": true,
		// no nvidia-uvm-tools, no other GPUs' nodes
	}}
	b, err := New(s, WithDevRoot(root), WithPathExists(fs.exists))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := devs[2].DeviceNodes, []string{"/host/dev/nvidia2", "/host/dev/nvidiactl", "/host/dev/nvidia-uvm"}; !reflect.DeepEqual(got, want) {
		t.Errorf("gpu-2 nodes %v, want %v", got, want)
	}
	if got, want := devs[5].DeviceNodes, []string{"/host/dev/nvidiactl", "/host/dev/nvidia-uvm"}; !reflect.DeepEqual(got, want) {
		t.Errorf("gpu-5 nodes %v, want %v", got, want)
	}
	for _, p := range fs.asked {
		if !strings.HasPrefix(p, "/host/dev/") {
			t.Errorf("existence checked outside the dev root: %q", p)
		}
	}
}

func TestDefaultDevRootAndRealExistenceCheck(t *testing.T) {
	dir := t.TempDir()
	// Only the control node exists in this fake dev root.
	if err := touch(filepath.Join(dir, "nvidiactl")); err != nil {
		t.Fatal(err)
	}
	b, err := New(newMock(t), WithDevRoot(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := devs[0].DeviceNodes, []string{filepath.Join(dir, "nvidiactl")}; !reflect.DeepEqual(got, want) {
		t.Errorf("nodes %v, want %v", got, want)
	}
	if defaultOptions().devRoot != "/dev" {
		t.Errorf("default dev root %q", defaultOptions().devRoot)
	}
}

func TestNUMANode(t *testing.T) {
	t.Run("not supported", func(t *testing.T) {
		s := newMock(t)
		mockDevice(t, s, 3).GetNumaNodeIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		devs, err := newBackend(t, s).Devices()
		if err != nil {
			t.Fatal(err)
		}
		if devs[3].NUMANode != -1 || devs[4].NUMANode != 1 {
			t.Errorf("NUMA nodes gpu-3 %d (want -1), gpu-4 %d (want 1)", devs[3].NUMANode, devs[4].NUMANode)
		}
	})
	t.Run("symbol missing from an older driver", func(t *testing.T) {
		s := newMock(t)
		s.LookupSymbolFunc = func(name string) error {
			if name == "nvmlDeviceGetNumaNodeId" {
				return errors.New("undefined symbol")
			}
			return nil
		}
		devs, err := newBackend(t, s).Devices()
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range devs {
			if d.NUMANode != -1 {
				t.Errorf("gpu-%d NUMA node %d, want -1", i, d.NUMANode)
			}
			if n := len(mockDevice(t, s, i).GetNumaNodeIdCalls()); n != 0 {
				t.Errorf("gpu-%d: GetNumaNodeId called %d times though the symbol is missing", i, n)
			}
		}
	})
	t.Run("other error fails", func(t *testing.T) {
		s := newMock(t)
		mockDevice(t, s, 6).GetNumaNodeIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
		_, err := newBackend(t, s).Devices()
		wantErr(t, err, gonvml.ERROR_GPU_IS_LOST, "GetNumaNodeId", "GPU 6")
	})
}

func TestDevicesErrorsNameCallAndIndex(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(s *server.Server)
		want   []string
	}{
		{"count", func(s *server.Server) {
			s.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
		}, []string{"DeviceGetCount"}},
		{"driver version", func(s *server.Server) {
			s.SystemGetDriverVersionFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
		}, []string{"SystemGetDriverVersion"}},
		{"cuda version", func(s *server.Server) {
			s.SystemGetCudaDriverVersionFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
		}, []string{"SystemGetCudaDriverVersion"}},
		{"handle", func(s *server.Server) {
			orig := s.DeviceGetHandleByIndexFunc
			s.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
				if i == 2 {
					return nil, gonvml.ERROR_UNKNOWN
				}
				return orig(i)
			}
		}, []string{"DeviceGetHandleByIndex", "GPU 2"}},
		{"memory", func(s *server.Server) {
			mockDevice(t, s, 5).GetMemoryInfoFunc = func() (gonvml.Memory, gonvml.Return) { return gonvml.Memory{}, gonvml.ERROR_UNKNOWN }
		}, []string{"GetMemoryInfo", "GPU 5"}},
		{"uuid", func(s *server.Server) {
			mockDevice(t, s, 7).GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
		}, []string{"GetUUID", "GPU 7"}},
		{"compute capability", func(s *server.Server) {
			mockDevice(t, s, 1).GetCudaComputeCapabilityFunc = func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_UNKNOWN }
		}, []string{"GetCudaComputeCapability", "GPU 1"}},
		{"pci", func(s *server.Server) {
			mockDevice(t, s, 4).GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return gonvml.PciInfo{}, gonvml.ERROR_UNKNOWN }
		}, []string{"GetPciInfo", "GPU 4"}},
		{"compute mode", func(s *server.Server) {
			mockDevice(t, s, 0).GetComputeModeFunc = func() (gonvml.ComputeMode, gonvml.Return) { return 0, gonvml.ERROR_UNKNOWN }
		}, []string{"GetComputeMode", "GPU 0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newMock(t)
			tc.break_(s)
			devs, err := newBackend(t, s).Devices()
			if devs != nil {
				t.Errorf("got devices %v alongside an error", devs)
			}
			wantErr(t, err, gonvml.ERROR_UNKNOWN, tc.want...)
		})
	}
}

func TestMalformedPCIBusIDFails(t *testing.T) {
	s := newMock(t)
	mockDevice(t, s, 3).GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) { return gonvml.PciInfo{}, gonvml.SUCCESS }
	_, err := newBackend(t, s).Devices()
	if err == nil || !strings.Contains(err.Error(), "GetPciInfo on GPU 3") {
		t.Fatalf("err = %v, want one naming GetPciInfo on GPU 3", err)
	}
}

func TestArchitectureNotSupportedIsUnknown(t *testing.T) {
	s := newMock(t)
	mockDevice(t, s, 0).GetArchitectureFunc = func() (gonvml.DeviceArchitecture, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	devs, err := newBackend(t, s).Devices()
	if err != nil {
		t.Fatal(err)
	}
	if devs[0].Architecture != "Unknown" || devs[1].Architecture != "Hopper" {
		t.Errorf("architectures %q, %q", devs[0].Architecture, devs[1].Architecture)
	}
}

func TestSetComputeMode(t *testing.T) {
	s := newMock(t)
	b := newBackend(t, s)
	target := mockDevice(t, s, 3)

	if err := b.SetComputeMode(target.UUID, gpu.ComputeModeExclusiveProcess); err != nil {
		t.Fatalf("SetComputeMode: %v", err)
	}
	calls := target.SetComputeModeCalls()
	if len(calls) != 1 || calls[0].ComputeMode != gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS {
		t.Fatalf("mock gpu-3 SetComputeMode calls %+v, want one with EXCLUSIVE_PROCESS", calls)
	}
	for i := range s.Devices {
		if i != 3 && len(mockDevice(t, s, i).SetComputeModeCalls()) != 0 {
			t.Errorf("gpu-%d's compute mode was set too", i)
		}
	}
	devs, err := b.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if devs[3].ComputeMode != gpu.ComputeModeExclusiveProcess || devs[2].ComputeMode != gpu.ComputeModeDefault {
		t.Errorf("after set: gpu-3 %q gpu-2 %q", devs[3].ComputeMode, devs[2].ComputeMode)
	}

	for mode, want := range map[gpu.ComputeMode]gonvml.ComputeMode{
		gpu.ComputeModeProhibited: gonvml.COMPUTEMODE_PROHIBITED,
		gpu.ComputeModeDefault:    gonvml.COMPUTEMODE_DEFAULT,
	} {
		if err := b.SetComputeMode(target.UUID, mode); err != nil {
			t.Fatal(err)
		}
		calls := target.SetComputeModeCalls()
		if got := calls[len(calls)-1].ComputeMode; got != want {
			t.Errorf("%s reached the mock as %d, want %d", mode, got, want)
		}
	}

	t.Run("unknown uuid", func(t *testing.T) {
		err := b.SetComputeMode("GPU-nope", gpu.ComputeModeDefault)
		wantErr(t, err, gonvml.ERROR_INVALID_ARGUMENT, "DeviceGetHandleByUUID", "GPU-nope")
	})
	t.Run("unsupported mode", func(t *testing.T) {
		before := len(target.SetComputeModeCalls())
		if err := b.SetComputeMode(target.UUID, "Shared"); err == nil {
			t.Error("no error for an unknown compute mode")
		}
		if len(target.SetComputeModeCalls()) != before {
			t.Error("an unknown compute mode reached NVML")
		}
	})
	t.Run("nvml refuses", func(t *testing.T) {
		target.SetComputeModeFunc = func(gonvml.ComputeMode) gonvml.Return { return gonvml.ERROR_NO_PERMISSION }
		err := b.SetComputeMode(target.UUID, gpu.ComputeModeExclusiveProcess)
		wantErr(t, err, gonvml.ERROR_NO_PERMISSION, "SetComputeMode", "GPU 3", target.UUID)
	})
}

func TestCloseShutsDownOnce(t *testing.T) {
	s := newMock(t)
	b, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.InitCalls()); n != 1 {
		t.Fatalf("Init called %d times by New, want 1", n)
	}
	if n := len(s.ShutdownCalls()); n != 0 {
		t.Fatalf("Shutdown called %d times before Close", n)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := len(s.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
	counts := len(s.DeviceGetCountCalls())
	if _, err := b.Devices(); err == nil {
		t.Error("Devices after Close succeeded")
	}
	if err := b.SetComputeMode(mockDevice(t, s, 0).UUID, gpu.ComputeModeDefault); err == nil {
		t.Error("SetComputeMode after Close succeeded")
	}
	if len(s.DeviceGetCountCalls()) != counts || len(mockDevice(t, s, 0).SetComputeModeCalls()) != 0 {
		t.Error("NVML was called after Shutdown")
	}
}

func TestCloseReportsShutdownError(t *testing.T) {
	s := newMock(t)
	s.ShutdownFunc = func() gonvml.Return { return gonvml.ERROR_UNKNOWN }
	b, err := New(s)
	if err != nil {
		t.Fatal(err)
	}
	wantErr(t, b.Close(), gonvml.ERROR_UNKNOWN, "Shutdown")
}

func TestInitFailure(t *testing.T) {
	for _, ret := range []gonvml.Return{gonvml.ERROR_LIBRARY_NOT_FOUND, gonvml.ERROR_DRIVER_NOT_LOADED} {
		s := newMock(t)
		s.InitFunc = func() gonvml.Return { return ret }
		_, err := New(s)
		if !errors.Is(err, ErrNotAvailable) || !errors.Is(err, ret) {
			t.Errorf("Init %v: err = %v, want ErrNotAvailable wrapping it", ret, err)
		}
	}
	s := newMock(t)
	s.InitFunc = func() gonvml.Return { return gonvml.ERROR_NO_PERMISSION }
	_, err := New(s)
	if errors.Is(err, ErrNotAvailable) {
		t.Errorf("permission error reported as a missing library: %v", err)
	}
	wantErr(t, err, gonvml.ERROR_NO_PERMISSION, "Init")
}

// TestOpenWithoutLibrary loads the real go-nvml library from a path that
// cannot exist, which is what a node without the driver looks like.
func TestOpenWithoutLibrary(t *testing.T) {
	b, err := Open(WithLibraryPath(filepath.Join(t.TempDir(), "libnvidia-ml.so.1")))
	if err == nil {
		b.Close()
		t.Fatal("Open succeeded without a library")
	}
	if !errors.Is(err, ErrNotAvailable) || !strings.Contains(err.Error(), "NVML not available") ||
		!strings.Contains(err.Error(), "driver libraries") {
		t.Errorf("err = %v", err)
	}
}

func TestMPSControlBinary(t *testing.T) {
	if got := newBackend(t, newMock(t)).MPSControlBinary(); got != "nvidia-cuda-mps-control" {
		t.Errorf("default %q", got)
	}
	if got := newBackend(t, newMock(t), WithMPSControlBinary("/usr/local/bin/mps")).MPSControlBinary(); got != "/usr/local/bin/mps" {
		t.Errorf("configured %q", got)
	}
}

func TestArchitectureNames(t *testing.T) {
	for arch, want := range map[gonvml.DeviceArchitecture]string{
		gonvml.DEVICE_ARCH_VOLTA:     "Volta",
		gonvml.DEVICE_ARCH_TURING:    "Turing",
		gonvml.DEVICE_ARCH_AMPERE:    "Ampere",
		gonvml.DEVICE_ARCH_ADA:       "Ada Lovelace",
		gonvml.DEVICE_ARCH_HOPPER:    "Hopper",
		gonvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
		gonvml.DEVICE_ARCH_UNKNOWN:   "Unknown",
		gonvml.DEVICE_ARCH_DLA:       "Unknown",
	} {
		if got := architectureName(arch); got != want {
			t.Errorf("architecture %d: %q, want %q", arch, got, want)
		}
	}
}

func TestComputeModeNames(t *testing.T) {
	for m, want := range map[gonvml.ComputeMode]gpu.ComputeMode{
		gonvml.COMPUTEMODE_DEFAULT:           gpu.ComputeModeDefault,
		gonvml.COMPUTEMODE_EXCLUSIVE_PROCESS: gpu.ComputeModeExclusiveProcess,
		gonvml.COMPUTEMODE_PROHIBITED:        gpu.ComputeModeProhibited,
		gonvml.COMPUTEMODE_EXCLUSIVE_THREAD:  "ExclusiveThread",
		7:                                    "Unknown(7)",
	} {
		if got := computeModeName(m); got != want {
			t.Errorf("mode %d: %q, want %q", m, got, want)
		}
	}
}

func TestCUDAVersion(t *testing.T) {
	for v, want := range map[int]string{12080: "12.8", 12040: "12.4", 11020: "11.2", 13000: "13.0", 12010: "12.1"} {
		if got := formatCUDAVersion(v); got != want {
			t.Errorf("%d: %q, want %q", v, got, want)
		}
	}
}

func TestNormalizePCIBusID(t *testing.T) {
	for in, want := range map[string]string{
		"00000000:3B:00.0": "0000:3b:00.0",
		"0000:3b:00.0":     "0000:3b:00.0",
		"00000001:AF:1F.7": "0001:af:1f.7",
		"00010000:01:00.0": "10000:01:00.0", // VMD domains exceed four digits, as in sysfs
		"3B:00.0":          "0000:3b:00.0",
	} {
		got, err := normalizePCIBusID(in)
		if err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "garbage", "0000:3b:00", "0000:3b:00.8", "0000:100:00.0", "0000:3b:20.0", "0000::00.0", "0000:3b:00.0:1"} {
		if got, err := normalizePCIBusID(bad); err == nil {
			t.Errorf("%q accepted as %q", bad, got)
		}
	}
}

func TestPCIBusIDFromLegacyField(t *testing.T) {
	var p gonvml.PciInfo
	for i, c := range []byte("0000:65:00.0") {
		p.BusIdLegacy[i] = int8(c)
	}
	if got, err := pciBusID(p); err != nil || got != "0000:65:00.0" {
		t.Errorf("got %q, %v", got, err)
	}
}

func wantErr(t *testing.T, err error, ret gonvml.Return, substrings ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one wrapping %v and naming %v", ret, substrings)
	}
	if !errors.Is(err, ret) {
		t.Errorf("error %q does not wrap %v", err, ret)
	}
	for _, s := range substrings {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
}

func touch(p string) error {
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	return f.Close()
}
