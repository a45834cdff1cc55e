package platform

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/promcheck"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

const (
	scrapeInterval = 2 * time.Second
	// The local cluster runs the plugin and the allocator on the host network (values-local.yaml).
	pluginMetrics    = "127.0.0.1:9464"
	allocatorMetrics = "127.0.0.1:9465"
)

// outDir is where the suite leaves Prometheus' log and the rendered dashboard.
func outDir(t *testing.T) string {
	dir := filepath.Join(framework.RepoRoot(), "_output", "e2e-platform")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// scraperToken is a token of a ServiceAccount bound to the chart's fgpu-metrics-reader, as a
// real Prometheus would scrape with.
func scraperToken(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	const name = "e2e-prometheus"
	if _, err := cluster.Client.CoreV1().ServiceAccounts(framework.Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: framework.Namespace}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "fgpu-metrics-reader"}}
	if _, err := cluster.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cluster.Client.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = cluster.Client.CoreV1().ServiceAccounts(framework.Namespace).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	tr, err := cluster.Client.CoreV1().ServiceAccounts(framework.Namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// startPrometheus runs Prometheus on the host, scraping the allocator and this node's plugin
// with static targets, and returns a client of its HTTP API.
func startPrometheus(t *testing.T, out string) promcheck.Client {
	t.Helper()
	dir := t.TempDir()
	token := filepath.Join(dir, "token")
	if err := os.WriteFile(token, []byte(scraperToken(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	job := func(name, target, extra string) string {
		return fmt.Sprintf(`- job_name: %s
  scheme: https
  tls_config: {insecure_skip_verify: true}
  authorization: {credentials_file: %s}
  static_configs:
  - targets: [%q]%s
`, name, token, target, extra)
	}
	// The plugin's series get the node label, as the chart's PodMonitor gives them.
	cfg := fmt.Sprintf("global: {scrape_interval: %s, evaluation_interval: %s}\nscrape_configs:\n", scrapeInterval, scrapeInterval) +
		job("fgpu-allocator", allocatorMetrics, "") + job("fgpu-kubelet-plugin", pluginMetrics, fmt.Sprintf("\n    labels: {node: %q}", cluster.Node))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	logf, err := os.Create(filepath.Join(out, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(framework.Bin("prometheus"), "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start Prometheus (built by e2e/cluster/build.sh): %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = logf.Close()
	})
	c := promcheck.Client{URL: "http://" + addr, HTTP: &http.Client{Timeout: 10 * time.Second}}
	// Both targets up.
	err = wait.PollUntilContextTimeout(context.Background(), time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := c.Instant(ctx, "sum(up)")
		return err == nil && len(s) == 1 && s[0].Values[0] == 2, nil
	})
	if err != nil {
		s, _ := c.Instant(context.Background(), "up")
		t.Fatalf("Prometheus does not scrape both fgpu targets (log: %s): up = %+v", logf.Name(), s)
	}
	return c
}

// kedaQuery is the query of the documented ScaledObject's Prometheus trigger, and the
// namespace it watches.
func kedaQuery(t *testing.T) (query, namespace string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(framework.RepoRoot(), "docs", "keda-scaledobject.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var so struct {
		Metadata struct{ Namespace string }
		Spec     struct {
			Triggers []struct {
				Type     string
				Metadata map[string]string
			}
		}
	}
	if err := yaml.Unmarshal(raw, &so); err != nil {
		t.Fatal(err)
	}
	if len(so.Spec.Triggers) != 1 || so.Spec.Triggers[0].Type != "prometheus" || so.Spec.Triggers[0].Metadata["query"] == "" {
		t.Fatalf("the example ScaledObject has no single Prometheus trigger with a query: %+v", so.Spec)
	}
	return so.Spec.Triggers[0].Metadata["query"], so.Metadata.Namespace
}

func scalar(t *testing.T, c promcheck.Client, q string) float64 {
	t.Helper()
	s, err := c.Instant(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	if len(s) != 1 {
		t.Fatalf("query %q: %d series, want 1", q, len(s))
	}
	return s[0].Values[0]
}

// Claims of two namespaces, one of them over its quota with a claim waiting: every query of
// every panel of the chart's dashboard returns data from a real Prometheus, a broken query
// fails the same check, and the KEDA example's query is above 0 while the claim waits and 0
// once it is placed.
func TestDashboardAndKEDASignal(t *testing.T) {
	ctx := context.Background()
	out := outDir(t)
	keda, teamA := kedaQuery(t)
	a := cluster.NamedNamespace(t, teamA)
	b := cluster.Namespace(t, "team-b")
	cluster.LabelNamespace(t, a, "fgpu.dev/e2e-quota", a)
	pol := builders.MakePolicy("e2e-platform-quota").Priority(10).Isolation(api.IsolationNone).
		Namespaces("fgpu.dev/e2e-quota", a).QuotaMemory("20Gi").Obj()
	if _, err := fgpuClient.FgpuV1alpha1().SharingPolicies().Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = fgpuClient.FgpuV1alpha1().SharingPolicies().Delete(context.Background(), pol.Name, metav1.DeleteOptions{})
	})
	time.Sleep(time.Second) // the allocator's informer
	for _, p := range []*framework.GPUPod{framework.MakeGPUPod(a, "p1").Memory("10Gi").Compute(10), framework.MakeGPUPod(b, "p1").Memory("5Gi").Compute(5)} {
		if _, err := cluster.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	// p2 uses 3Gi of its 10Gi on its fake GPU, so the per-claim use panel has a measurement.
	p2 := framework.MakeGPUPod(a, "p2").Memory("10Gi").Compute(20)
	if _, err := cluster.Client.ResourceV1().ResourceClaimTemplates(a).Create(ctx, p2.Template(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.Client.CoreV1().Pods(a).Create(ctx, usingPod(p2, "0:3Gi:30"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	running := map[[2]string]*corev1.Pod{}
	for _, p := range [][2]string{{a, "p1"}, {a, "p2"}, {b, "p1"}} {
		pod, err := cluster.WaitRunning(ctx, p[0], p[1], 2*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		running[p] = pod
	}
	if _, err := cluster.Create(ctx, framework.MakeGPUPod(a, "p3").Memory("10Gi").Compute(10)); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, a, "p3", "quota", 30*time.Second); err != nil {
		t.Fatal(err)
	}

	prom := startPrometheus(t, out)
	start := time.Now()

	// The KEDA signal: the claim of team-a waits.
	err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		return scalar(t, prom, keda) > 0, nil
	})
	if err != nil {
		t.Fatalf("KEDA query %q stays at %v while a claim of %s waits for quota", keda, scalar(t, prom, keda), a)
	}
	t.Logf("KEDA query %q = %v while p3 waits", keda, scalar(t, prom, keda))

	// The before-and-after panels' GPUs needed and memory at fgpu's sizes exist once a
	// workload has a recommendation: p2's, from its measured use (20 samples).
	p2Claim, err := cluster.ClaimOf(ctx, running[[2]string{a, "p2"}])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitEvent(ctx, a, p2Claim.Name, "Pod "+a+"/p2 request gpu: recommended memory", 2*time.Minute); err != nil {
		t.Fatal(err)
	}

	// Every panel's every query, with the namespace that waits and this node; refusals and
	// placements need two samples in their window, use a few measurements.
	queries, err := promcheck.LoadDashboard(filepath.Join(framework.RepoRoot(), "deployments", "helm", "fgpu", "dashboards", "fgpu.json"),
		map[string]string{"namespace": a, "node": cluster.Node})
	if err != nil {
		t.Fatal(err)
	}
	var results []promcheck.Result
	// A timeout leaves the last results, whose failures are reported below.
	_ = wait.PollUntilContextTimeout(ctx, 2*time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		results = promcheck.Check(ctx, prom, queries, start, time.Now(), scrapeInterval)
		return len(promcheck.Failed(results)) == 0 && time.Since(start) > 10*scrapeInterval, nil
	})
	for _, e := range promcheck.Failed(results) {
		t.Errorf("dashboard: %v", e)
	}
	t.Logf("dashboard: %d queries of %d panels checked", len(queries), panelCount(queries))
	png := filepath.Join(out, "dashboard.png")
	if err := promcheck.RenderPNG(png, fmt.Sprintf("fgpu dashboard, e2e data (namespace %s, node %s)", a, cluster.Node), results); err != nil {
		t.Error(err)
	} else {
		t.Logf("dashboard rendered from the queries' results: %s", png)
		fmt.Println("dashboard PNG:", png)
	}

	// The checker fails a query that does not parse and one that names no series.
	bad := promcheck.Failed(promcheck.Check(ctx, prom, []promcheck.Query{
		{Panel: "broken", RefID: "A", Expr: `sum((fgpu_allocator_pending_claims`},
		{Panel: "misspelt", RefID: "A", Expr: `fgpu_allocator_pending_claim`}}, start, time.Now(), scrapeInterval))
	if len(bad) != 2 {
		t.Errorf("the checker passed a broken or empty query: %v", bad)
	}

	// Placed: the signal drops to 0.
	zero := int64(0)
	if err := cluster.Client.CoreV1().Pods(a).Delete(ctx, "p1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if _, err := cluster.WaitRunning(ctx, a, "p3", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(context.Context) (bool, error) {
		return scalar(t, prom, keda) == 0, nil
	})
	if err != nil {
		t.Fatalf("KEDA query %q = %v after p3 was placed, want 0", keda, scalar(t, prom, keda))
	}
	t.Logf("KEDA query = 0 once p3 is placed")
}

// fakeDevDir is where the chart's plugin keeps its fake device nodes and their usage files.
const fakeDevDir = framework.StateDir + "/fake-dev"

// usingPod is the GPU pod whose fgpu-probe plays a usage pattern on its fake GPU: it needs the
// node's PID namespace (its PID is what the usage file names) and the fake device directory.
func usingPod(p *framework.GPUPod, steps string) *corev1.Pod {
	pod := p.Pod()
	pod.Spec.HostPID = true
	c := &pod.Spec.Containers[0]
	c.Args = []string{"--replay-usage", steps, "--usage-dir", fakeDevDir}
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "fake-dev", MountPath: fakeDevDir})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "fake-dev",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: fakeDevDir}}})
	return pod
}

func panelCount(qs []promcheck.Query) int {
	seen := map[string]bool{}
	for _, q := range qs {
		seen[q.Panel] = true
	}
	return len(seen)
}
