// Command podbench measures, on the local cluster with fgpu installed, pod create→Running
// for pods with an fgpu claim against plain pods, and the plugin's RSS with many prepared
// claims. Run it through `make bench-e2e` (which brings the cluster up).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

func main() {
	rounds := flag.Int("rounds", 20, "pods of each kind, created one at a time")
	claims := flag.Int("claims", 100, "claims held at once for the RSS figure (0: skip)")
	mode := flag.String("mode", "scheduler", `allocation mode to install: "scheduler" or "allocator"`)
	flag.Parse()
	if err := run(*rounds, *claims, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "podbench:", err)
		os.Exit(1)
	}
}

func run(rounds, claims int, mode string) error {
	// Two GPUs: namespaces do not share one by default, so each fresh namespace's claim takes
	// the GPU the held share leaves.
	c, err := framework.Setup("kubeletPlugin.gpus=fake:2xH100-80GB", "allocationMode="+mode)
	if err != nil || c == nil {
		return fmt.Errorf("no cluster: %v", err)
	}
	ctx := context.Background()
	ns := "podbench"
	if err := createNamespace(ctx, c, ns); err != nil {
		return err
	}
	defer func() {
		if err := deleteAll(ctx, c, ns); err != nil {
			fmt.Fprintln(os.Stderr, "podbench: cleanup:", err)
		}
	}()

	// A pod that holds a share keeps the namespace's MPS daemon running on the GPU, so the
	// timed claims of ns join a running daemon; each claim of a fresh namespace is that
	// namespace's first on the GPU and needs a daemon of its own.
	if _, err := c.Create(ctx, framework.MakeGPUPod(ns, "hold").Memory("1Gi")); err != nil {
		return err
	}
	if _, err := c.WaitRunning(ctx, ns, "hold", 2*time.Minute); err != nil {
		return err
	}
	var plain, joining, first stages
	for i := 0; i < rounds; i++ {
		d, err := timePod(ctx, c, ns, fmt.Sprintf("plain-%d", i), nil)
		if err != nil {
			return err
		}
		plain.add(d)
		d, err = timePod(ctx, c, ns, fmt.Sprintf("gpu-%d", i), framework.MakeGPUPod(ns, fmt.Sprintf("gpu-%d", i)).Memory("1Gi"))
		if err != nil {
			return err
		}
		joining.add(d)
		fresh := fmt.Sprintf("%s-first-%d", ns, i)
		if err := createNamespace(ctx, c, fresh); err != nil {
			return err
		}
		// What any pod of a new namespace waits for is not the claim's: its service account
		// and the API server's CA, which kube-controller-manager adds after the namespace.
		if err := namespaceReady(ctx, c, fresh); err != nil {
			return err
		}
		d, err = timePod(ctx, c, fresh, "gpu", framework.MakeGPUPod(fresh, "gpu").Memory("1Gi"))
		if err != nil {
			return err
		}
		first.add(d)
		if err := deleteAll(ctx, c, fresh); err != nil {
			return err
		}
	}
	fmt.Printf("%s mode: pod create→Running over %d pods each (one at a time):\n", mode, rounds)
	fmt.Printf("  plain pod                               p50 %6.0f ms  p95 %6.0f ms\n", pct(plain.total, 50), pct(plain.total, 95))
	fmt.Printf("  pod + claim, namespace's daemon runs    p50 %6.0f ms  p95 %6.0f ms  (adds %4.0f ms)\n", pct(joining.total, 50), pct(joining.total, 95), pct(joining.total, 50)-pct(plain.total, 50))
	fmt.Printf("  pod + claim, namespace's first on a GPU p50 %6.0f ms  p95 %6.0f ms  (adds %4.0f ms)\n", pct(first.total, 50), pct(first.total, 95), pct(first.total, 50)-pct(plain.total, 50))
	fmt.Println("where the time goes, p50 of each step as watched (ms): claim made, claim allocated, pod bound, pod running")
	for _, s := range []struct {
		name string
		st   *stages
	}{{"plain pod", &plain}, {"daemon runs", &joining}, {"first on a GPU", &first}} {
		fmt.Printf("  %-16s", s.name)
		for i, step := range s.st.steps {
			if len(step) > 0 {
				fmt.Printf("  %s %5.0f", stepNames[i], pct(step, 50))
			}
		}
		fmt.Println()
	}

	if claims == 0 {
		return nil
	}
	if err := deleteAll(ctx, c, ns); err != nil {
		return err
	}
	if err := createNamespace(ctx, c, ns); err != nil {
		return err
	}
	for i := 0; i < claims; i++ {
		if _, err := c.Create(ctx, framework.MakeGPUPod(ns, fmt.Sprintf("hold-%d", i)).Memory("512Mi")); err != nil {
			return err
		}
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
		st, err := framework.ReadNodeState()
		return err == nil && len(st.Checkpoint.Claims) >= claims, nil
	})
	if err != nil {
		return fmt.Errorf("%d claims never prepared", claims)
	}
	pids := framework.PluginPIDs()
	if len(pids) != 1 {
		return fmt.Errorf("plugin processes: %v", pids)
	}
	fmt.Printf("plugin RSS with %d prepared claims: %s\n", claims, rss(pids[0]))
	return nil
}

// stepNames are the steps a pod with a claim passes on its way to running, each timed from
// the one before (a plain pod has only the last two, the first from its creation).
var stepNames = [4]string{"made", "allocated", "bound", "running"}

// timing is one pod's way to running: its steps and the whole.
type timing struct {
	steps [4]time.Duration
	total time.Duration
}

// stages collects the timings of pods of one kind.
type stages struct {
	steps [4][]time.Duration
	total []time.Duration
}

func (s *stages) add(t timing) {
	s.total = append(s.total, t.total)
	for i, d := range t.steps {
		if d > 0 {
			s.steps[i] = append(s.steps[i], d)
		}
	}
}

// watchSteps records when each step of pod name in ns is first seen, from two watches
// opened before the pod is made; it stops when ctx ends.
func watchSteps(ctx context.Context, c *framework.Cluster, ns, name string) (seen func() [4]time.Time, err error) {
	pods, err := c.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name})
	if err != nil {
		return nil, err
	}
	claims, err := c.Client.ResourceV1().ResourceClaims(ns).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		pods.Stop()
		return nil, err
	}
	var mu sync.Mutex
	var at [4]time.Time
	mark := func(i int) {
		mu.Lock()
		defer mu.Unlock()
		if at[i].IsZero() {
			at[i] = time.Now()
		}
	}
	go func() {
		defer pods.Stop()
		for ev := range pods.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				if p.Spec.NodeName != "" {
					mark(2)
				}
				if p.Status.Phase == corev1.PodRunning {
					mark(3)
				}
			}
		}
	}()
	go func() {
		defer claims.Stop()
		for ev := range claims.ResultChan() {
			if cl, ok := ev.Object.(*resourceapi.ResourceClaim); ok && strings.HasPrefix(cl.Name, name+"-") {
				mark(0)
				if cl.Status.Allocation != nil {
					mark(1)
				}
			}
		}
	}()
	return func() [4]time.Time {
		mu.Lock()
		defer mu.Unlock()
		return at
	}, nil
}

// timePod creates a pod (plain when gpu is nil), waits until it runs and says how long each
// step took.
func timePod(ctx context.Context, c *framework.Cluster, ns, name string, gpu *framework.GPUPod) (timing, error) {
	var t timing
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	seen, err := watchSteps(wctx, c, ns, name)
	if err != nil {
		return t, err
	}
	start := time.Now()
	if gpu != nil {
		if _, err := c.Create(ctx, gpu); err != nil {
			return t, err
		}
	} else {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{{
				Name: "probe", Image: framework.Image, ImagePullPolicy: corev1.PullNever, Command: []string{"/usr/bin/fgpu-probe"},
			}}},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return t, err
		}
	}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 2*time.Minute, true, func(context.Context) (bool, error) {
		return !seen()[3].IsZero(), nil
	}); err != nil {
		return t, fmt.Errorf("pod %s/%s not running: %w", ns, name, err)
	}
	at := seen()
	t.total = at[3].Sub(start)
	prev := start
	for i, when := range at {
		if !when.IsZero() {
			t.steps[i], prev = when.Sub(prev), when
		}
	}
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return t, err
	}
	// The next pod starts on a quiet node: the kubelet and containerd tear this one down
	// for a while after it is gone from the API, and on two cores that slows whatever
	// starts meanwhile.
	time.Sleep(settle)
	// And with no spare MPS daemon still starting, which a first claim could not take.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		st, err := framework.ReadNodeState()
		return err == nil && len(st.ReadySpares) == len(st.Spares), nil
	}); err != nil {
		return t, fmt.Errorf("a spare MPS daemon did not get ready: %w", err)
	}
	return t, nil
}

// settle is how long the kubelet takes to tear a deleted pod down on the local cluster
// (its container stopped, its sandbox removed), and past the plugin's start of a new spare
// MPS daemon 3 s after a first claim took one.
const settle = 4 * time.Second

// createNamespace creates ns; one left by an earlier run is reused.
func createNamespace(ctx context.Context, c *framework.Cluster, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// namespaceReady waits for the service account and the CA bundle every pod of ns mounts.
func namespaceReady(ctx context.Context, c *framework.Cluster, ns string) error {
	return wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if _, err := c.Client.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{}); err != nil {
			return false, nil
		}
		_, err := c.Client.CoreV1().ConfigMaps(ns).Get(ctx, "kube-root-ca.crt", metav1.GetOptions{})
		return err == nil, nil
	})
}

// deleteAll deletes ns and waits until it is gone.
func deleteAll(ctx context.Context, c *framework.Cluster, ns string) error {
	if err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return err != nil, nil
	})
}

func pct(d []time.Duration, p int) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[(len(s)-1)*p/100].Milliseconds())
}

func rss(pid int) string {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmRSS:"))
		}
	}
	return "unknown"
}
