// Command gpucheck runs fgpu's node side as production runs it, without Kubernetes: the
// plugin's own code prepares claims of two tenants of different namespaces on GPU 0, starting
// one MPS control daemon per tenant in the shape of the pod the DaemonSet's plugin gives it
// (daemon.go: the same command, host PID and IPC namespaces, its shm tmpfs as /dev/shm, a
// lifetime of its own); each tenant then runs as a
// container would (`gpucheck tenant`: own PID, mount and IPC namespaces, exactly the CDI
// spec's device nodes, mounts and environment). The plugin is killed and started again while
// the tenants run, and must find every daemon still running. run.sh drives it.
//
// With --gpus nvml (a cgo build) it drives a real GPU and the real MPS daemon; with --gpus
// fake:<spec> it drives fake GPUs and the MPS stand-in, which is what CI runs.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/gpu/nvml"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

// claim is one tenant's claim on GPU 0.
type claim struct {
	name, namespace, memory, share string
}

// The first two claims are prepared by the first plugin; a2 by the restarted one, in a's
// domain, so it must reuse a's daemon.
var (
	firstClaims = []claim{
		{"a", "team-a", "10Gi", "00000000-0000-4000-8000-000000000001"},
		{"b", "team-b", "20Gi", "00000000-0000-4000-8000-000000000002"},
	}
	laterClaim = claim{"a2", "team-a", "6Gi", "00000000-0000-4000-8000-000000000003"}
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "tenant-init" {
		err := tenantInit()
		fmt.Fprintln(os.Stderr, "gpucheck tenant:", err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == "mps-daemon-init" {
		err := daemonInit()
		fmt.Fprintln(os.Stderr, "gpucheck MPS daemon:", err)
		os.Exit(1)
	}
	fs := flag.NewFlagSet("gpucheck", flag.ExitOnError)
	o := options{}
	fs.StringVar(&o.gpus, "gpus", "nvml", `"nvml" (real GPUs; a cgo build) or "fake:<spec>" (e.g. fake:1xH100-80GB)`)
	fs.StringVar(&o.root, "root", "/tmp/fgpu-check", "the plugin's state: CDI specs, checkpoint, MPS directories")
	fs.StringVar(&o.driverRoot, "driver-root", "", `the driver's root for the CDI spec (default "/" with nvml, a fake driver under --root with fake GPUs)`)
	fs.StringVar(&o.mpsControl, "mps-control", "", "the MPS control binary (default: from the driver; fake-mps-control with fake GPUs)")
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: gpucheck [flags] plugin OUTDIR | restart OUTDIR | unprepare | tenant ... | faults ... OUTDIR | usage ...")
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
	if fs.NArg() < 1 {
		fs.Usage()
		os.Exit(2)
	}
	if err := run(o, fs.Arg(0), fs.Args()[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(1)
	}
}

type options struct {
	gpus, root, driverRoot, mpsControl string
}

// shmSize is each MPS server's shm tmpfs, shared with its clients.
const shmSize = 64 << 20

func (o options) config() plugin.Config {
	mpsRoot := filepath.Join(o.root, "mps")
	return plugin.Config{
		DriverName: api.DriverName, NodeName: "gpu-host",
		CDIDir: filepath.Join(o.root, "cdi"), PluginDataDir: filepath.Join(o.root, "plugin"), MPSRoot: mpsRoot,
		DevRoot: "/dev", DriverRoot: o.driverRoot, ReservedMemory: 1 << 30,
		MPSLauncher: hostLauncher{root: mpsRoot}, MPSPods: plugin.MPSPodConfig{ShmSize: shmSize},
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

func (o *options) backend(cfg *plugin.Config) (gpu.Backend, error) {
	if spec, ok := strings.CutPrefix(o.gpus, "fake:"); ok {
		fleet, err := fake.ParseSpec(spec)
		if err != nil {
			return nil, err
		}
		cfg.DevRoot = filepath.Join(o.root, "fake-dev")
		if cfg.DriverRoot == "" {
			cfg.DriverRoot = filepath.Join(o.root, "fake-driver")
			if _, err := fake.LayOutDriverRoot(cfg.DriverRoot); err != nil {
				return nil, err
			}
		}
		bin := o.mpsControl
		if bin == "" {
			bin = "fake-mps-control"
		}
		return fake.New(fleet, cfg.NodeName, cfg.DevRoot, bin)
	}
	if o.gpus != "nvml" {
		return nil, fmt.Errorf(`--gpus must be "nvml" or "fake:<spec>", not %q`, o.gpus)
	}
	if cfg.DriverRoot == "" {
		cfg.DriverRoot = "/"
	}
	var opts []nvml.Option
	if o.mpsControl != "" {
		opts = append(opts, nvml.WithMPSControlBinary(o.mpsControl))
	}
	b, err := nvml.Open(opts...)
	if err != nil {
		return nil, err
	}
	return modeReporter{b}, nil
}

func run(o options, phase string, args []string) error {
	switch phase {
	case "tenant":
		return tenant(args)
	case "usage":
		return usageCheck(o, args)
	}
	cfg := o.config()
	backend, err := o.backend(&cfg)
	if err != nil {
		return err
	}
	defer backend.Close()
	devs, err := backend.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		fmt.Printf("GPU: %s %s %s arch=%s cc=%s driver=%s memory=%s pci=%s mode=%s nodes=%v\n",
			d.Name(), d.UUID, d.ProductName, d.Architecture, d.CUDAComputeCapability, d.DriverVersion,
			resource.NewQuantity(d.MemoryBytes, resource.BinarySI), d.PCIBusID, d.ComputeMode, d.DeviceNodes)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	state, err := plugin.NewState(ctx, cfg, backend, nil)
	if err != nil {
		return err
	}
	switch phase {
	case "plugin":
		if len(args) != 1 {
			return errors.New("plugin needs an output directory")
		}
		out := args[0]
		if err := os.MkdirAll(out, 0o755); err != nil {
			return err
		}
		for _, c := range firstClaims {
			if err := prepare(ctx, state, cfg, out, c); err != nil {
				return err
			}
		}
		daemons, err := daemonPIDs(cfg)
		if err != nil {
			return err
		}
		fmt.Printf("MPS control daemons (directory: PID): %v\n", daemons)
		if err := os.WriteFile(filepath.Join(out, "daemons"), []byte(formatPIDs(daemons)), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, "ready"), nil, 0o644); err != nil {
			return err
		}
		// The plugin keeps running, as in its DaemonSet, until it is killed.
		<-ctx.Done()
		return nil
	case "faults":
		return faults(ctx, o, state, cfg, backend, devs, args)
	case "restart":
		if len(args) != 1 {
			return errors.New("restart needs an output directory")
		}
		return restart(ctx, state, cfg, args[0])
	case "unprepare":
		for uid := range state.PreparedClaims() {
			if err := state.Unprepare(ctx, uid); err != nil {
				return err
			}
		}
		left, _ := os.ReadDir(cfg.MPSRoot)
		specs, _ := os.ReadDir(cfg.CDIDir)
		fmt.Printf("after unprepare: %d MPS directories, %d CDI specs, %d checkpoint entries\n", len(left), len(specs), len(state.PreparedClaims()))
		if len(left)+len(specs)+len(state.PreparedClaims()) > 0 {
			return errors.New("unprepare left state behind")
		}
		return nil
	}
	return fmt.Errorf("unknown phase %q", phase)
}

// restart is the plugin started again: every daemon the first one started must still run
// with the same PID, and a new claim of a's domain must reuse a's daemon.
func restart(ctx context.Context, state *plugin.State, cfg plugin.Config, out string) error {
	raw, err := os.ReadFile(filepath.Join(out, "daemons"))
	if err != nil {
		return err
	}
	before := parsePIDs(string(raw))
	after, err := daemonPIDs(cfg)
	if err != nil {
		return err
	}
	fmt.Printf("after the plugin's restart, MPS control daemons: %v (before: %v)\n", after, before)
	for key, pid := range before {
		if after[key] != pid {
			return fmt.Errorf("MPS daemon %s was PID %d before the plugin restarted, now %d", key, pid, after[key])
		}
	}
	if err := prepare(ctx, state, cfg, out, laterClaim); err != nil {
		return err
	}
	again, err := daemonPIDs(cfg)
	if err != nil {
		return err
	}
	if len(again) != len(before) {
		return fmt.Errorf("claim %s of a running domain started another daemon: %v", laterClaim.name, again)
	}
	fmt.Printf("claim %s reused its domain's daemon: %v\n", laterClaim.name, again)
	return nil
}

func prepare(ctx context.Context, state *plugin.State, cfg plugin.Config, out string, c claim) error {
	share := types.UID(c.share)
	rc := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Name: "claim-" + c.name, UID: types.UID("uid-" + c.name)},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: cfg.DriverName, Pool: cfg.NodeName, Device: "gpu-0", ShareID: &share,
				ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(c.memory)},
			}},
		}}},
	}
	devices, err := state.Prepare(ctx, rc)
	if err != nil {
		return fmt.Errorf("prepare claim %s: %w", c.name, err)
	}
	ids := devices[0].CDIDeviceIDs
	fmt.Printf("prepared claim %s (%s, namespace %s): CDI %v\n", c.name, c.memory, c.namespace, ids)
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return err
	}
	var env []string
	for _, id := range ids {
		d := cache.GetDevice(id)
		if d == nil {
			return fmt.Errorf("CDI device %s of claim %s is in no spec", id, c.name)
		}
		env = append(env, d.ContainerEdits.Env...)
	}
	fmt.Printf("claim %s environment:\n  %s\n", c.name, strings.Join(env, "\n  "))
	if err := os.WriteFile(filepath.Join(out, "claim-"+c.name+".env"), []byte(strings.Join(env, "\n")+"\n"), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(out, "claim-"+c.name+".devices"), []byte(strings.Join(ids, ",")), 0o644)
}

// daemonPIDs reads the PID file every MPS control daemon writes into its pipe directory,
// by daemon directory.
func daemonPIDs(cfg plugin.Config) (map[string]int, error) {
	entries, err := os.ReadDir(cfg.MPSRoot)
	if err != nil {
		return nil, err
	}
	pids := map[string]int{}
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(cfg.MPSRoot, e.Name(), "pipe", "nvidia-cuda-mps-control.pid"))
		if err != nil {
			return nil, fmt.Errorf("MPS daemon %s: %w", e.Name(), err)
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
		if err != nil {
			return nil, fmt.Errorf("MPS daemon %s: PID file: %w", e.Name(), err)
		}
		pids[e.Name()] = pid
	}
	return pids, nil
}

func formatPIDs(pids map[string]int) string {
	var lines []string
	for k, p := range pids {
		lines = append(lines, fmt.Sprintf("%s %d", k, p))
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}

func parsePIDs(s string) map[string]int {
	pids := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			if p, err := strconv.Atoi(v); err == nil {
				pids[k] = p
			}
		}
	}
	return pids
}
