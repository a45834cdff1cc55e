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
	"time"

	corev1 "k8s.io/api/core/v1"
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
	var plain, joining, first []time.Duration
	for i := 0; i < rounds; i++ {
		d, err := timePod(ctx, c, ns, fmt.Sprintf("plain-%d", i), nil)
		if err != nil {
			return err
		}
		plain = append(plain, d)
		d, err = timePod(ctx, c, ns, fmt.Sprintf("gpu-%d", i), framework.MakeGPUPod(ns, fmt.Sprintf("gpu-%d", i)).Memory("1Gi"))
		if err != nil {
			return err
		}
		joining = append(joining, d)
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
		first = append(first, d)
		if err := deleteAll(ctx, c, fresh); err != nil {
			return err
		}
	}
	fmt.Printf("%s mode: pod create→Running over %d pods each (one at a time):\n", mode, rounds)
	fmt.Printf("  plain pod                               p50 %6.0f ms  p95 %6.0f ms\n", pct(plain, 50), pct(plain, 95))
	fmt.Printf("  pod + claim, namespace's daemon runs    p50 %6.0f ms  p95 %6.0f ms  (adds %4.0f ms)\n", pct(joining, 50), pct(joining, 95), pct(joining, 50)-pct(plain, 50))
	fmt.Printf("  pod + claim, namespace's first on a GPU p50 %6.0f ms  p95 %6.0f ms  (adds %4.0f ms)\n", pct(first, 50), pct(first, 95), pct(first, 50)-pct(plain, 50))

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

// timePod creates a pod (plain when gpu is nil) and waits until it runs.
func timePod(ctx context.Context, c *framework.Cluster, ns, name string, gpu *framework.GPUPod) (time.Duration, error) {
	start := time.Now()
	if gpu != nil {
		if _, err := c.Create(ctx, gpu); err != nil {
			return 0, err
		}
	} else {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{TerminationGracePeriodSeconds: ptr.To[int64](0), Containers: []corev1.Container{{
				Name: "probe", Image: framework.Image, ImagePullPolicy: corev1.PullNever, Command: []string{"/usr/bin/fgpu-probe"},
			}}},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return 0, err
		}
	}
	if _, err := c.WaitRunning(ctx, ns, name, 2*time.Minute); err != nil {
		return 0, err
	}
	d := time.Since(start)
	zero := int64(0)
	if err := c.Client.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		return 0, err
	}
	return d, nil
}

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
