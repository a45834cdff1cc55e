// Command fgpu-allocator is fgpu's central allocator: it places pending ResourceClaims of
// fgpu's DeviceClasses on GPUs under the cluster's SharingPolicies and writes their
// allocations. One replica leads at a time (a Lease); the others wait.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/adoption"
	"github.com/fgpu-dev/fgpu/pkg/controller"
	"github.com/fgpu-dev/fgpu/pkg/extendedresource"
	"github.com/fgpu-dev/fgpu/pkg/leader"
	"github.com/fgpu-dev/fgpu/pkg/serve"
)

type flags struct {
	cfg              controller.Config
	classes          string
	exclusiveClasses string
	metrics          serve.MetricsOptions
	kubeconfig       string
	leaderElect      bool
	leaseNamespace   string
	leaseName        string
	leaseDuration    time.Duration
	renewDeadline    time.Duration
	retryPeriod      time.Duration
	qps              float32
	burst            int
	extendedResource string
}

func main() {
	f := flags{cfg: controller.DefaultConfig()}
	cmd := &cobra.Command{
		Use:           "fgpu-allocator",
		Short:         "Place fgpu GPU-share claims under sharing policies and write their allocations",
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE:          func(cmd *cobra.Command, _ []string) error { return run(cmd.Context(), f) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.cfg.DriverName, "driver-name", f.cfg.DriverName, "DRA driver name")
	fs.StringVar(&f.classes, "device-classes", strings.Join(f.cfg.DeviceClasses, ","), "DeviceClasses whose claims the allocator places")
	fs.StringVar(&f.exclusiveClasses, "exclusive-classes", strings.Join(f.cfg.ExclusiveClasses, ","), "DeviceClasses whose requests take whole GPUs")
	fs.DurationVar(&f.cfg.BindTimeout, "bind-timeout", f.cfg.BindTimeout, "take an allocation back, and place the claim elsewhere, when its pod is not scheduled within this time")
	fs.DurationVar(&f.cfg.OrphanGrace, "orphan-grace", f.cfg.OrphanGrace, "take an allocation back when no pod has used the claim for this long")
	fs.IntVar(&f.cfg.Workers, "workers", f.cfg.Workers, "claims written in parallel (decisions are serialised; each placement waits on two API round trips, so this bounds placements per second)")
	fs.StringVar(&f.cfg.Placement, "placement", f.cfg.Placement, "placement policy for standard claims: "+strings.Join(placement.Names(), ", "))
	fs.StringSliceVar(&f.cfg.GangTopologyKeys, "gang-topology-keys", f.cfg.GangTopologyKeys, "node labels, nearest first, by which a gang's next pod (a PodGroup, JobSet or Kueue pod group) is placed near its other pods; empty: not kept together")
	fs.DurationVar(&f.cfg.Sizing.HalfLife, "sizing-half-life", f.cfg.Sizing.HalfLife, "sizing: a measured sample this much older weighs half as much in a workload's recommendation")
	fs.Float64Var(&f.cfg.Sizing.Headroom, "sizing-headroom", f.cfg.Sizing.Headroom, "sizing: a recommendation is the measured percentile times 1 plus this (0.15: 15% more)")
	fs.IntVar(&f.cfg.Sizing.MinSamples, "sizing-min-samples", f.cfg.Sizing.MinSamples, "sizing: measured samples (one per claim per kubelet plugin poll) before a workload gets a recommendation")
	fs.DurationVar(&f.cfg.SizingReportInterval, "sizing-report-interval", f.cfg.SizingReportInterval, "sizing Auto: the kubelet plugin's usage report interval; bursting shares are admitted onto a GPU by their co-tenants' use lined up per interval of this length")
	fs.DurationVar(&f.cfg.SizingBurstWindow, "sizing-burst-window", f.cfg.SizingBurstWindow, "sizing Auto: how much of the co-tenants' measured use a bursting share's admission compares")
	fs.DurationVar(&f.cfg.SizingShrinkAfter, "sizing-shrink-after", f.cfg.SizingShrinkAfter, "sizing Auto: a pod whose GPU memory use stayed under 80% of its cap this long is evicted to come back smaller")
	f.metrics.AddFlags(fs, ":9465")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster)")
	fs.BoolVar(&f.metrics.Profiling, "profiling", false, "serve Go's pprof handlers under /debug/pprof/ on the metrics address, behind its authorization")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "run only while holding the Lease")
	fs.StringVar(&f.cfg.Namespace, "namespace", os.Getenv("POD_NAMESPACE"), "the allocator's namespace, where the kubelet plugins keep what they measure of GPU pods fgpu did not place (default $POD_NAMESPACE; empty: not read)")
	fs.StringVar(&f.leaseNamespace, "leader-elect-namespace", os.Getenv("POD_NAMESPACE"), "namespace of the Lease (default $POD_NAMESPACE)")
	fs.StringVar(&f.leaseName, "leader-elect-name", "fgpu-allocator", "name of the Lease")
	fs.DurationVar(&f.leaseDuration, "leader-elect-lease-duration", 15*time.Second, "Lease duration: how long other replicas wait after the leader's last renew before they take over; must exceed the renew deadline")
	fs.DurationVar(&f.renewDeadline, "leader-elect-renew-deadline", 10*time.Second, "renew deadline: the leader stops writing this long after its last successful renew (the rest of the lease duration is the margin for a write in flight)")
	fs.DurationVar(&f.retryPeriod, "leader-elect-retry-period", 2*time.Second, "retry period")
	fs.StringVar(&f.extendedResource, "extended-resource", "", "make the ResourceClaimTemplates fgpu-gpu-N that the chart's admission policy rewrites this extended resource's requests (e.g. nvidia.com/gpu) to use; empty: none. "+
		"The sizing metrics count the GPUs pods fgpu did not place hold from it (empty: "+adoption.DefaultExtendedResource+")")
	fs.Float32Var(&f.qps, "kube-api-qps", 1000, "API requests per second (a placement costs 3 writes: finalizer and status annotation, allocation, an event on its pod)")
	fs.IntVar(&f.burst, "kube-api-burst", 2000, "API request burst")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	fs.AddGoFlagSet(klogFlags)

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := cmd.ExecuteContext(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "fgpu-allocator:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags) error {
	logger := klog.FromContext(ctx)
	f.cfg.DeviceClasses = splitList(f.classes)
	f.cfg.ExclusiveClasses = splitList(f.exclusiveClasses)
	f.cfg.ExtendedResource = f.extendedResource
	if _, err := placement.New(f.cfg.Placement, nil); err != nil {
		return fmt.Errorf("--placement: %w", err)
	}
	rc, err := serve.RestConfig(f.kubeconfig, "fgpu-allocator", f.qps, f.burst)
	if err != nil {
		return err
	}
	// client renews the Lease and checks who may read the metrics: never fenced.
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	reg := serve.Registry()
	metrics := controller.NewMetrics(reg)
	var fence *leader.Fence
	ctrlConfig := rest.CopyConfig(rc)
	// Every write the controller sends is counted (fgpu_allocator_api_writes_total).
	ctrlConfig.Wrap(metrics.CountWrites)
	if f.leaderElect {
		if err := leader.ValidateTimings(f.leaseDuration, f.renewDeadline, f.retryPeriod); err != nil {
			return err
		}
		// Every write the controller makes asks the fence first, and again as it is sent,
		// with a deadline when another replica may lead: a deposed leader stops writing
		// before another replica can take the Lease.
		fence = leader.NewFence(clock.RealClock{}, f.renewDeadline, f.leaseDuration)
		f.cfg.Fence = fence
		ctrlConfig.Wrap(fence.WrapTransport)
	}
	ctrlClient, err := kubernetes.NewForConfig(ctrlConfig)
	if err != nil {
		return err
	}
	// CRDs speak JSON only; the core client keeps protobuf.
	crd := rest.CopyConfig(ctrlConfig)
	crd.ContentType, crd.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	fgpuClient, err := versioned.NewForConfig(crd)
	if err != nil {
		return err
	}
	stopMetrics, err := serve.Metrics(ctx, f.metrics, reg, client)
	if err != nil {
		return err
	}
	defer stopMetrics()
	runCtrl := func(ctx context.Context) error {
		if f.extendedResource != "" {
			go keepTemplates(ctx, ctrlClient, f.extendedResource)
		}
		return controller.New(f.cfg, ctrlClient, fgpuClient, metrics).Run(ctx)
	}
	if !f.leaderElect {
		return runCtrl(ctx)
	}
	if f.leaseNamespace == "" {
		return errors.New("--leader-elect-namespace (or $POD_NAMESPACE) is required with --leader-elect")
	}
	host, _ := os.Hostname()
	id := host + "_" + string(uuid.NewUUID())
	lock := fence.Lock(&resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: f.leaseNamespace, Name: f.leaseName},
		Client:     client.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	})
	// The controller's result, passed by channel: OnStartedLeading runs in its own goroutine,
	// which RunOrDie does not wait for.
	ran := make(chan error, 1)
	lost := make(chan struct{})
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		// The release goes through the fenced lock: it waits for the controller's writes in
		// flight, which may still be running when ctx is cancelled.
		Lock: lock, ReleaseOnCancel: true, Name: f.leaseName,
		LeaseDuration: f.leaseDuration, RenewDeadline: f.renewDeadline, RetryPeriod: f.retryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				logger.Info("Leading; starting the allocator", "identity", id)
				ran <- runCtrl(ctx)
			},
			OnStoppedLeading: func() {
				logger.Info("No longer leading", "identity", id)
				close(lost)
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Another replica leads", "leader", identity)
				}
			},
		},
	})
	var runErr error
	if ctx.Err() == nil {
		// Lost the lease without being asked to stop: exit so that a fresh process
		// rebuilds its state from the API server before it decides anything again.
		<-lost
		select {
		case runErr = <-ran:
		default:
		}
		if runErr != nil {
			return runErr
		}
		return errors.New("lost the leader lease")
	}
	select {
	case runErr = <-ran:
	default:
	}
	return runErr
}

// keepTemplates runs the extended-resource template keeper while this replica leads: its
// writes go through the same fenced client as the allocator's.
func keepTemplates(ctx context.Context, client kubernetes.Interface, resource string) {
	bcast := record.NewBroadcaster(record.WithContext(ctx))
	bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer bcast.Shutdown()
	recorder := bcast.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "fgpu-allocator"})
	if err := extendedresource.NewTemplateKeeper(client, recorder, resource, api.DeviceClassShared).Run(ctx); err != nil {
		klog.FromContext(ctx).Error(err, "Extended-resource templates are not kept")
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
