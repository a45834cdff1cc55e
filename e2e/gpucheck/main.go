// Command gpucheck runs fgpu's node side on a real NVIDIA GPU without Kubernetes: NVML
// discovery, then two claims (10Gi and 20Gi of GPU 0) prepared by the plugin's own code with
// the real MPS control daemon, their CDI environment written out so that CUDA processes can be
// started with exactly what a container would get; `unprepare` undoes it. run.sh drives it.
// It needs cgo (NVML): build with CGO_ENABLED=1.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/nvml"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

const root = "/tmp/fgpu-check"

var claims = map[string]string{"a": "10Gi", "b": "20Gi"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gpucheck prepare OUTDIR | unprepare")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2:]); err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(1)
	}
}

// modeReporter lets the check go on where the VM refuses a compute-mode change, saying so.
type modeReporter struct{ gpu.Backend }

func (m modeReporter) SetComputeMode(uuid string, mode gpu.ComputeMode) error {
	if err := m.Backend.SetComputeMode(uuid, mode); err != nil {
		fmt.Printf("compute mode %s on %s refused: %v (continuing)\n", mode, uuid, err)
		return nil
	}
	fmt.Printf("compute mode of %s set to %s\n", uuid, mode)
	return nil
}

func run(phase string, args []string) error {
	backend, err := nvml.Open()
	if err != nil {
		return err
	}
	defer backend.Close()
	devs, err := backend.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		fmt.Printf("NVML: %s %s %s arch=%s cc=%s driver=%s cuda=%s memory=%s minor=%d pci=%s numa=%d mode=%s nodes=%v\n",
			d.Name(), d.UUID, d.ProductName, d.Architecture, d.CUDAComputeCapability, d.DriverVersion, d.CUDADriverVersion,
			resource.NewQuantity(d.MemoryBytes, resource.BinarySI), d.Minor, d.PCIBusID, d.NUMANode, d.ComputeMode, d.DeviceNodes)
	}
	cfg := plugin.Config{
		DriverName: api.DriverName, NodeName: "gpu-host",
		CDIDir: filepath.Join(root, "cdi"), PluginDataDir: filepath.Join(root, "plugin"), MPSRoot: filepath.Join(root, "mps"),
		DevRoot: "/dev", ReservedMemory: 1 << 30,
	}
	ctx := context.Background()
	state, err := plugin.NewState(ctx, cfg, modeReporter{backend}, nil)
	if err != nil {
		return err
	}
	switch phase {
	case "prepare":
		if len(args) != 1 {
			return fmt.Errorf("prepare needs an output directory")
		}
		return prepare(ctx, state, cfg, args[0])
	case "unprepare":
		for name := range claims {
			if err := state.Unprepare(ctx, "uid-"+name); err != nil {
				return err
			}
		}
		entries, _ := os.ReadDir(cfg.MPSRoot)
		specs, _ := os.ReadDir(cfg.CDIDir)
		fmt.Printf("after unprepare: %d MPS directories, %d CDI specs, %d checkpoint entries\n", len(entries), len(specs), len(state.PreparedClaims()))
		return nil
	}
	return fmt.Errorf("unknown phase %q", phase)
}

func prepare(ctx context.Context, state *plugin.State, cfg plugin.Config, out string) error {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for name, mem := range claims {
		share := types.UID(fmt.Sprintf("00000000-0000-4000-8000-00000000000%s", map[string]string{"a": "1", "b": "2"}[name]))
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "check", Name: "claim-" + name, UID: types.UID("uid-" + name)},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{
					Request: "gpu", Driver: cfg.DriverName, Pool: cfg.NodeName, Device: "gpu-0", ShareID: &share,
					ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(mem)},
				}},
			}}},
		}
		devices, err := state.Prepare(ctx, claim)
		if err != nil {
			return fmt.Errorf("prepare claim %s: %w", name, err)
		}
		fmt.Printf("prepared claim %s (%s): CDI %v\n", name, mem, devices[0].CDIDeviceIDs)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	for name := range claims {
		var env []string
		for _, id := range cache.ListDevices() {
			if strings.Contains(id, "uid-"+name+"-") {
				env = append(env, cache.GetDevice(id).ContainerEdits.Env...)
			}
		}
		file := filepath.Join(out, "claim-"+name+".env")
		if err := os.WriteFile(file, []byte(strings.Join(env, "\n")+"\n"), 0o644); err != nil {
			return err
		}
		fmt.Printf("claim %s environment:\n  %s\n", name, strings.Join(env, "\n  "))
	}
	return nil
}
