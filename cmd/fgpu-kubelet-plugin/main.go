// Command fgpu-kubelet-plugin publishes a node's GPUs as shareable DRA devices and prepares
// fgpu claims for the kubelet.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/driverroot"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/gpu/nvml"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
	"github.com/fgpu-dev/fgpu/pkg/reaper"
	"github.com/fgpu-dev/fgpu/pkg/serve"
)

type flags struct {
	cfg            plugin.Config
	gpus           string
	mpsControl     string
	reservedMemory string
	mpsShmSize     string
	mpsPullPolicy  string
	allocationMode string
	metrics        serve.MetricsOptions
	kubeconfig     string
}

func main() {
	f := flags{}
	cmd := &cobra.Command{
		Use:           "fgpu-kubelet-plugin",
		Short:         "Publish GPUs as shareable DRA devices and prepare fgpu claims",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), f) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.cfg.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME)")
	fs.StringVar(&f.cfg.DriverName, "driver-name", api.DriverName, "DRA driver name")
	fs.StringVar(&f.gpus, "gpus", "nvml", `GPU backend: "nvml", "fake:<count>x<model>[,...][/<topology>]" (e.g. fake:4xH100-80GB, fake:8xH100-80GB/nvlink-2x4) or "fake-file:<fleet.yaml>"`)
	fs.StringVar(&f.cfg.DevRoot, "dev-root", "", "directory of the GPU device nodes (default /dev; fake GPUs: /var/run/fgpu/fake-dev)")
	fs.StringVar(&f.cfg.DriverRoot, "driver-root", "", `host path of the NVIDIA driver installation that claims' containers get (libraries, tools, IPC sockets): "/" (the default) or e.g. /run/nvidia/driver (GPU Operator); fake GPUs: a fake driver laid out at /var/run/fgpu/fake-driver (default) or the given path`)
	fs.StringVar(&f.cfg.DriverRootLocal, "driver-root-container-path", "", "where the plugin's container sees --driver-root (default: the same path)")
	fs.StringVar(&f.mpsControl, "mps-control-binary", "", "MPS control binary (default nvidia-cuda-mps-control; fake GPUs: fake-mps-control)")
	fs.StringVar(&f.cfg.MPSPods.Image, "mps-daemon-image", "", "image of the MPS control daemons' pods (the plugin's own; fake GPUs: it carries fake-mps-control); empty: the daemons run as the plugin's children and die with it, for use outside Kubernetes")
	fs.StringVar(&f.mpsPullPolicy, "mps-daemon-image-pull-policy", string(corev1.PullIfNotPresent), "pull policy of --mps-daemon-image")
	fs.StringVar(&f.cfg.MPSPods.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the plugin's namespace, where the MPS daemons' pods run and observe mode's ConfigMap is kept (default $POD_NAMESPACE)")
	fs.StringVar(&f.cfg.MPSPods.ServiceAccount, "mps-daemon-service-account", "", "service account of the MPS daemons' pods (its token is not mounted; empty: the namespace's default)")
	fs.StringVar(&f.cfg.MPSPods.PriorityClass, "mps-daemon-priority-class", "", "priority class of the MPS daemons' pods; a critical one (system-node-critical) makes the kubelet evict other pods to admit a daemon on a full node")
	fs.StringVar(&f.mpsShmSize, "mps-shm-size", "256Mi", "size of the tmpfs each MPS server and its clients share as /dev/shm (with --mps-daemon-image)")
	fs.StringVar(&f.cfg.CDIDir, "cdi-dir", "/var/run/cdi", "directory for the per-claim CDI specs")
	fs.StringVar(&f.cfg.MPSRoot, "mps-root", "/var/run/fgpu/mps", "directory for MPS pipe and log directories (same path on the host and in the container)")
	fs.StringVar(&f.cfg.PluginDataDir, "plugin-data-dir", "/var/lib/kubelet/plugins/"+api.DriverName, "plugin socket and checkpoint directory")
	fs.StringVar(&f.cfg.RegistrarDir, "registrar-dir", "/var/lib/kubelet/plugins_registry", "kubelet plugin registry directory")
	fs.StringVar(&f.reservedMemory, "reserved-memory", "1Gi", "memory kept back on each GPU for the driver and the MPS server")
	fs.StringVar(&f.allocationMode, "allocation-mode", "scheduler", `"scheduler": kube-scheduler allocates shares; "allocator": devices are fenced with a taint only fgpu's allocator tolerates`)
	fs.StringVar(&f.cfg.CgroupRoot, "cgroup-root", "/sys/fs/cgroup", `the node's cgroup v2 mount as the plugin sees it; where its dmem controller lists a GPU (NVIDIA driver r615+, kernel 6.14+), each pod's MPS shares of it are capped as a whole (dmem.max) besides per process; "" turns that off`)
	fs.DurationVar(&f.cfg.ForeignPoll, "foreign-poll-interval", plugin.DefaultForeignPoll, "how often GPUs are checked for compute processes fgpu did not start (such a GPU is tainted "+api.ForeignTaintKey+" and keeps its compute mode)")
	fs.DurationVar(&f.cfg.HealthPoll, "health-poll-interval", plugin.DefaultHealthPoll, "how often the GPUs' faults are read (a faulty GPU is tainted "+api.FaultTaintKey+" or "+api.DegradedTaintKey+" within it)")
	fs.DurationVar(&f.cfg.UsagePoll, "usage-poll-interval", plugin.DefaultUsagePoll, "how often each prepared claim's GPU memory and SM activity are measured (negative: not measured)")
	fs.DurationVar(&f.cfg.UsageReport, "usage-report-interval", plugin.DefaultUsageReport, "the least time between two reports of a claim's measured use in its status.devices[].data.usage (each report is one claim status update)")
	fs.DurationVar(&f.cfg.UsageHeartbeat, "usage-heartbeat", plugin.DefaultUsageHeartbeat, "a claim whose use did not move beyond the thresholds is reported again after this long")
	fs.IntVar(&f.cfg.FlapCount, "flap-count", plugin.DefaultFlapCount, "a GPU that faults this many times within --flap-window stays fenced ("+api.FlappingTaintKey+") for --flap-backoff")
	fs.DurationVar(&f.cfg.FlapWindow, "flap-window", plugin.DefaultFlapWindow, "see --flap-count")
	fs.DurationVar(&f.cfg.FlapBackoff, "flap-backoff", plugin.DefaultFlapBackoff, "see --flap-count")
	f.metrics.AddFlags(fs, ":9464")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster)")
	klogFlags := goflagSet()
	fs.AddGoFlagSet(klogFlags)

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cmd.ExecuteContext(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fgpu-kubelet-plugin:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) error {
	logger := klog.FromContext(ctx)
	if f.cfg.NodeName == "" {
		return errors.New("--node-name (or $NODE_NAME) is required")
	}
	reserved, err := resource.ParseQuantity(f.reservedMemory)
	if err != nil {
		return fmt.Errorf("--reserved-memory: %w", err)
	}
	f.cfg.ReservedMemory = reserved.Value()
	if f.cfg.MPSPods.Image != "" {
		shm, err := resource.ParseQuantity(f.mpsShmSize)
		if err != nil || shm.Value() <= 0 {
			return fmt.Errorf("--mps-shm-size %q: a positive size, e.g. 256Mi", f.mpsShmSize)
		}
		f.cfg.MPSPods.ShmSize = shm.Value()
		f.cfg.MPSPods.PullPolicy = corev1.PullPolicy(f.mpsPullPolicy)
		if f.cfg.MPSPods.Namespace == "" {
			return errors.New("--namespace (or $POD_NAMESPACE) is required with --mps-daemon-image")
		}
	}
	switch f.allocationMode {
	case "scheduler":
	case "allocator":
		f.cfg.Fenced = true
	default:
		return fmt.Errorf(`--allocation-mode must be "scheduler" or "allocator", not %q`, f.allocationMode)
	}
	// Before the first MPS daemon: each detaches and, once stopped, must be waited for here.
	if err := reaper.Start(ctx); err != nil {
		return err
	}
	inNode, err := plugin.InNodePIDNamespace("/proc")
	if err != nil {
		logger.Error(err, "Cannot tell whether the plugin runs in the node's PID namespace; taking it that it does not")
	}
	f.cfg.OwnPIDNamespace = !inNode
	backend, err := newBackend(logger, &f)
	if err != nil {
		return err
	}
	defer backend.Close()
	// More than client-go's default 5 per second: a node's prepares, refusals, events and
	// the MPS daemons' pods and budgets share this budget, and one tenant's churn must not
	// spend another's.
	rc, err := serve.RestConfig(f.kubeconfig, "fgpu-kubelet-plugin", 50, 100)
	if err != nil {
		return fmt.Errorf("kubernetes client config: %w", err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	reg := serve.Registry()
	metrics := plugin.NewMetrics(reg)
	stopMetrics, err := serve.Metrics(ctx, f.metrics, reg, client)
	if err != nil {
		return err
	}
	defer stopMetrics()
	driver, err := plugin.Start(ctx, f.cfg, backend, client, metrics)
	if err != nil {
		return err
	}
	devs, _ := backend.Devices()
	logger.Info("fgpu kubelet plugin running", "node", f.cfg.NodeName, "gpus", len(devs), "allocationMode", f.allocationMode)
	select {
	case <-ctx.Done():
		driver.Stop()
		return nil
	case <-driver.Failed():
		driver.Stop()
		// Exit so the kubelet restarts the plugin from its checkpoint.
		return driver.Err()
	}
}

func newBackend(logger klog.Logger, f *flags) (gpu.Backend, error) {
	switch {
	case f.gpus == "nvml":
		opts := []nvml.Option{nvml.WithLogger(logger)}
		if f.cfg.DevRoot != "" {
			opts = append(opts, nvml.WithDevRoot(f.cfg.DevRoot))
		}
		if f.mpsControl != "" {
			opts = append(opts, nvml.WithMPSControlBinary(f.mpsControl))
		}
		if f.cfg.DriverRoot == "" {
			f.cfg.DriverRoot = "/"
		}
		// NVML from the driver root, the one the containers get: the plugin's image carries no
		// driver, and a library of another version would not talk to the kernel module.
		drv, err := driverroot.Discover(logger, driverroot.Root{Host: f.cfg.DriverRoot, Local: f.cfg.DriverRootLocal})
		if err != nil {
			return nil, fmt.Errorf("--driver-root: %w", err)
		}
		if drv.NVML == "" {
			return nil, fmt.Errorf("no libnvidia-ml.so.1 for driver %s under driver root %s: the NVML backend cannot load the driver", drv.Version, f.cfg.DriverRoot)
		}
		opts = append(opts, nvml.WithLibraryPath(drv.NVML))
		// A daemon's pod runs the driver's own nvidia-cuda-mps-control.
		f.cfg.MPSPods.DriverRoot = f.cfg.DriverRoot
		return nvml.Open(opts...)
	case strings.HasPrefix(f.gpus, "fake:"), strings.HasPrefix(f.gpus, "fake-file:"):
		var fleet fake.Fleet
		var err error
		if spec, ok := strings.CutPrefix(f.gpus, "fake:"); ok {
			fleet, err = fake.ParseSpec(spec)
		} else {
			fleet, err = fake.LoadFleetFile(strings.TrimPrefix(f.gpus, "fake-file:"))
		}
		if err != nil {
			return nil, fmt.Errorf("--gpus: %w", err)
		}
		if f.cfg.DevRoot == "" {
			f.cfg.DevRoot = "/var/run/fgpu/fake-dev"
		}
		if f.mpsControl == "" {
			f.mpsControl = "fake-mps-control"
		}
		if err := layOutFakeDriver(f); err != nil {
			return nil, err
		}
		// The stand-in daemon lists itself beside the fake device nodes, as NVML lists a server.
		f.cfg.MPSPods.HostPaths = []string{f.cfg.DevRoot}
		return fake.New(fleet, f.cfg.NodeName, f.cfg.DevRoot, f.mpsControl)
	default:
		return nil, fmt.Errorf(`--gpus must be "nvml", "fake:<spec>" or "fake-file:<path>", not %q`, f.gpus)
	}
}

// layOutFakeDriver gives fake GPUs a fake driver for their containers to see, never over a
// real installation: the host's root is refused, here as --driver-root or as the container
// path it is seen at, and LayOutDriverRoot writes only into an empty or fake driver root.
func layOutFakeDriver(f *flags) error {
	if f.cfg.DriverRoot == "" {
		f.cfg.DriverRoot = "/var/run/fgpu/fake-driver"
	}
	local := f.cfg.DriverRootLocal
	if local == "" {
		local = f.cfg.DriverRoot
	}
	if filepath.Clean(f.cfg.DriverRoot) == "/" || filepath.Clean(local) == "/" {
		return errors.New("--driver-root or --driver-root-container-path is / with fake GPUs: the plugin lays out a fake driver there, so give it a directory of its own (default /var/run/fgpu/fake-driver)")
	}
	if _, err := fake.LayOutDriverRoot(local); err != nil {
		return fmt.Errorf("--driver-root: %w", err)
	}
	return nil
}
