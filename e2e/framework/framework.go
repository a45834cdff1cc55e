// Package framework is the harness of fgpu's e2e suites: it talks to the local cluster
// (e2e/cluster), installs the chart, creates GPU pods and inspects what the node holds.
package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

const (
	// Namespace is where the chart is installed.
	Namespace = "fgpu-system"
	// Driver is the DRA driver name.
	Driver = api.DriverName
	// StateDir is the plugin's host directory (MPS directories, fake device nodes).
	StateDir = "/var/run/fgpu"
	// CDIDir is where the plugin writes claim specs.
	CDIDir = "/var/run/cdi"
	// PauseTrigger pauses a prepare while it exists, in a plugin built with -tags fgpu_e2e
	// (pkg/plugin/faults_e2e.go names the same path).
	PauseTrigger = StateDir + "/test-pause-prepare"
	// CheckpointPath is the plugin's checkpoint on the host.
	CheckpointPath = "/var/lib/kubelet/plugins/" + Driver + "/checkpoint.json"
)

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Kubeconfig is the local cluster's admin kubeconfig.
func Kubeconfig() string {
	if k := os.Getenv("KUBECONFIG"); k != "" {
		return k
	}
	return filepath.Join(RepoRoot(), "_output", "cluster", "kubeconfig")
}

// Cluster holds clients for the local cluster.
type Cluster struct {
	Config *rest.Config
	Client kubernetes.Interface
	Node   string
}

// Required is set by `make test-e2e`: there a missing cluster is a failure, not a skip.
func Required() bool { return os.Getenv("FGPU_E2E") == "1" }

// Setup connects to the local cluster and installs the chart with the given --set values,
// for a suite's TestMain. It returns nil (and the suite skips) when no cluster is up and
// the suite is not Required.
func Setup(sets ...string) (*Cluster, error) {
	c, err := connect()
	if err != nil {
		if Required() {
			return nil, fmt.Errorf("no local cluster: %w", err)
		}
		fmt.Fprintf(os.Stderr, "skipping e2e suite: no local cluster (run `make test-e2e`): %v\n", err)
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	return c, c.Install(ctx, sets...)
}

func connect() (*Cluster, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", Kubeconfig())
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, n := range nodes.Items {
		// The real node is the one with a kubelet; load tests add Node objects without one.
		if n.Status.NodeInfo.KubeletVersion != "" {
			return &Cluster{Config: cfg, Client: client, Node: n.Name}, nil
		}
	}
	return nil, fmt.Errorf("the cluster has no node")
}

// Run runs a command from the repository root with the cluster's kubeconfig.
func Run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = RepoRoot()
	cmd.Env = append(os.Environ(), "KUBECONFIG="+Kubeconfig())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// Bin is a tool built into _output/bin (kubectl, helm).
func Bin(name string) string { return filepath.Join(RepoRoot(), "_output", "bin", name) }

// Install installs or upgrades the chart with the fake GPUs and the local cluster's values,
// plus the given --set values, and waits until this node's plugin runs the new settings and
// publishes its GPUs. (Not helm's --wait: load tests add Node objects without a kubelet, on
// which the DaemonSet's pods never start.)
func (c *Cluster) Install(ctx context.Context, sets ...string) error {
	args := []string{"upgrade", "--install", "fgpu", "deployments/helm/fgpu", "-n", Namespace, "--create-namespace",
		"-f", "deployments/helm/fgpu/values-fake.yaml", "-f", "e2e/values-local.yaml"}
	gpus := 2      // values-fake.yaml
	fenced := true // the chart's default allocationMode is allocator
	for _, s := range sets {
		args = append(args, "--set", s)
		if spec, ok := strings.CutPrefix(s, "kubeletPlugin.gpus=fake:"); ok {
			gpus = fakeGPUCount(spec)
		}
		if m, ok := strings.CutPrefix(s, "allocationMode="); ok {
			fenced = m == "allocator"
		}
	}
	if _, err := Run(ctx, Bin("helm"), args...); err != nil {
		return err
	}
	if err := c.waitPluginCurrent(ctx); err != nil {
		return err
	}
	return c.waitForDevices(ctx, gpus, fenced, 2*time.Minute)
}

func fakeGPUCount(spec string) int {
	n := 0
	for _, part := range strings.Split(spec, ",") {
		count, _, _ := strings.Cut(part, "x")
		v, _ := strconv.Atoi(count)
		n += v
	}
	return n
}

// waitPluginCurrent waits for a Ready plugin pod on this node that runs the DaemonSet's
// current arguments.
func (c *Cluster) waitPluginCurrent(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets(Namespace).Get(ctx, "fgpu-kubelet-plugin", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{
			LabelSelector: "app.kubernetes.io/component=kubelet-plugin", FieldSelector: "spec.nodeName=" + c.Node})
		if err != nil {
			return false, nil
		}
		want := ds.Spec.Template.Spec.Containers[0].Args
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil && slices.Equal(p.Spec.Containers[0].Args, want) && podReady(&p) {
				return true, nil
			}
		}
		return false, nil
	})
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Uninstall removes the chart and waits for the plugin's pods to be gone: helm waits for the
// DaemonSet only, and its pods go a moment later, long enough for an Install right after to
// take one for its own. (The kubelet deletes the plugin's ResourceSlices some time after.)
func (c *Cluster) Uninstall(ctx context.Context) error {
	if _, err := Run(ctx, Bin("helm"), "uninstall", "fgpu", "-n", Namespace, "--wait", "--timeout", "2m"); err != nil && !strings.Contains(err.Error(), "not found") {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
		return err == nil && len(pods.Items) == 0, nil
	})
}

// waitForDevices waits until this node's slices publish exactly n GPUs, each with the
// allocator's fence taint in allocator mode and without it in scheduler mode: until the new
// plugin republishes them, kube-scheduler could allocate the previous mode's devices.
func (c *Cluster) waitForDevices(ctx context.Context, n int, fenced bool, timeout time.Duration) error {
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		list, err := c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + c.Node})
		if err != nil {
			return false, nil
		}
		devices := 0
		for _, s := range list.Items {
			if s.Spec.Driver != Driver {
				continue
			}
			for _, d := range s.Spec.Devices {
				if slices.ContainsFunc(d.Taints, func(t resourceapi.DeviceTaint) bool { return t.Key == api.FenceTaintKey }) != fenced {
					return false, nil
				}
			}
			devices += len(s.Spec.Devices)
		}
		return devices == n, nil
	})
}

// Namespace creates a namespace for one test and deletes it (waiting for its pods to be
// gone, so the node is unprepared) when the test ends.
func (c *Cluster) Namespace(t *testing.T, prefix string) string {
	t.Helper()
	return c.createNamespace(t, metav1.ObjectMeta{GenerateName: prefix + "-"})
}

// NamedNamespace is Namespace with an exact name, for tests about the name itself.
func (c *Cluster) NamedNamespace(t *testing.T, name string) string {
	t.Helper()
	return c.createNamespace(t, metav1.ObjectMeta{Name: name})
}

func (c *Cluster) createNamespace(t *testing.T, meta metav1.ObjectMeta) string {
	t.Helper()
	ns, err := c.Client.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: meta}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.dumpNamespace(t, ns.Name)
		}
		c.DeleteNamespace(t, ns.Name)
	})
	return ns.Name
}

// DeleteNamespace deletes a namespace and waits until it is gone.
func (c *Cluster) DeleteNamespace(t *testing.T, name string) {
	ctx := context.Background()
	zero := int64(0)
	_ = c.Client.CoreV1().Pods(name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete namespace %s: %v", name, err)
		return
	}
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("namespace %s not gone: %v", name, err)
	}
}

func (c *Cluster) dumpNamespace(t *testing.T, ns string) {
	out, _ := Run(context.Background(), Bin("kubectl"), "-n", ns, "get", "pods,resourceclaims,events", "-o", "wide")
	t.Logf("namespace %s at failure:\n%s", ns, out)
	logs, _ := Run(context.Background(), Bin("kubectl"), "-n", Namespace, "logs", "-l", "app.kubernetes.io/component=kubelet-plugin", "--tail=40")
	t.Logf("plugin log tail:\n%s", logs)
}

// WaitAllocatorReady waits until the allocator Deployment runs its current spec on a ready pod.
func (c *Cluster) WaitAllocatorReady(ctx context.Context) error {
	return wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		d, err := c.Client.AppsV1().Deployments(Namespace).Get(ctx, "fgpu-allocator", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		return d.Status.ReadyReplicas >= 1 && d.Status.UpdatedReplicas == d.Status.Replicas && d.Status.ObservedGeneration == d.Generation, nil
	})
}

// LabelNamespace sets a label on a test namespace (policies select by it).
func (c *Cluster) LabelNamespace(t *testing.T, ns, k, v string) {
	t.Helper()
	ctx := context.Background()
	n, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n.Labels == nil {
		n.Labels = map[string]string{}
	}
	n.Labels[k] = v
	if _, err := c.Client.CoreV1().Namespaces().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// DaemonPods returns the MPS daemon pods on this node by name, but for the spares no claim
// took (NodeState.Spares).
func (c *Cluster) DaemonPods(ctx context.Context) (map[string]corev1.Pod, error) {
	list, err := c.Client.CoreV1().Pods(Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/component=mps-daemon", FieldSelector: "spec.nodeName=" + c.Node})
	if err != nil {
		return nil, err
	}
	cp, err := checkpoint.NewStore(CheckpointPath).Load()
	if err != nil {
		return nil, err
	}
	out := map[string]corev1.Pod{}
	for _, p := range list.Items {
		if !IdleSpare(cp, p.Labels[api.LabelMPSDaemon]) {
			out[p.Name] = p
		}
	}
	return out, nil
}
