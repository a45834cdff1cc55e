// Package kueue is the e2e suite of issue #15 item 1: fgpu under a real Kueue controller.
// Kueue's manager (built by e2e/cluster/build.sh from its Go module, e2e/tools/kueue) runs as
// a host process beside the local cluster's control plane, with the CRDs from its module and
// its Job and Pod webhooks served on 127.0.0.1 with a certificate this suite makes. Kueue
// charges ClusterQueue quota on the memory capacity of fgpu's device classes
// (deviceClassMappings with a capacity source, gate KueueDRAIntegrationConsumableCapacity);
// fgpu, in allocator mode on two fake 80Gi GPUs, places the admitted pods' claims.
package kueue

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/e2e/framework"
)

var (
	cluster   *framework.Cluster
	dynClient dynamic.Interface
)

const (
	// managedLabel marks the namespaces Kueue manages (managedJobsNamespaceSelector) and its
	// webhooks see: nothing outside this suite's namespaces meets Kueue.
	managedLabel = "fgpu.dev/e2e-kueue"
	// quotaResource is the ClusterQueue resource that Kueue charges fgpu claims' memory to.
	quotaResource = "fgpu.dev/gpu-memory"
	webhookName   = "fgpu-e2e-kueue"
	webhookPort   = 19443
	healthAddr    = "127.0.0.1:18081"
	// metricsCertDir is where Kueue's manager looks for its metrics certificate.
	metricsCertDir = "/etc/kueue/metrics/certs"
)

// kueueConfig is Kueue's Configuration: both fgpu classes charge the devices' memory capacity
// to one quota resource (a whole GPU is charged the GPU's memory, the device's default), and
// every Job or Pod in a managed namespace is Kueue's, queue name or not.
const kueueConfig = `apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health: {healthProbeBindAddress: "` + healthAddr + `"}
metrics: {bindAddress: "0"}
webhook: {host: 127.0.0.1, port: %d, certDir: %q}
leaderElection: {leaderElect: false}
internalCertManagement: {enable: false}
manageJobsWithoutQueueName: true
managedJobsNamespaceSelector: {matchLabels: {` + managedLabel + `: managed}}
integrations: {frameworks: ["batch/job", "pod"]}
resources:
  deviceClassMappings:
  - name: ` + quotaResource + `
    deviceClassNames: [gpu.fgpu.dev, exclusive.gpu.fgpu.dev]
    sources:
    - capacity: {name: memory, driver: gpu.fgpu.dev, deviceSelector: {cel: {expression: "true"}}}
`

func TestMain(m *testing.M) {
	var stop func()
	framework.Main(m, framework.Suite{
		Values: []string{"allocationMode=allocator", "kubeletPlugin.gpus=fake:2xH100-80GB", "allocator.verbosity=4"},
		Ready: func(ctx context.Context, c *framework.Cluster) (err error) {
			cluster = c
			if dynClient, err = dynamic.NewForConfig(c.Config); err != nil {
				return err
			}
			if err = c.WaitAllocatorReady(ctx); err != nil {
				return err
			}
			stop, err = startKueue(ctx)
			return err
		},
		Teardown: func(ctx context.Context) error { return removeKueue(ctx, stop) },
	})
}

// kueueModule is Kueue's module directory in the Go module cache (config/components).
func kueueModule(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kueue")
	cmd.Dir = filepath.Join(framework.RepoRoot(), "e2e", "tools", "kueue")
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("finding Kueue's module: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// startKueue installs Kueue's CRDs and runs its manager; the returned func stops it.
func startKueue(ctx context.Context) (func(), error) {
	mod, err := kueueModule(ctx)
	if err != nil {
		return nil, err
	}
	crds := filepath.Join(mod, "config", "components", "crd", "bases")
	kubectl := framework.Bin("kubectl")
	if _, err := framework.Run(ctx, kubectl, "apply", "--server-side", "-f", crds); err != nil {
		return nil, err
	}
	if _, err := framework.Run(ctx, kubectl, "wait", "--for=condition=Established", "--timeout=60s", "-f", crds); err != nil {
		return nil, err
	}
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kueue-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	dir := filepath.Join(framework.RepoRoot(), "_output", "kueue")
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return nil, err
	}
	caPEM, err := writeServingCert(certDir)
	if err != nil {
		return nil, err
	}
	// Without internal cert management Kueue reads its metrics server's certificate from this
	// fixed path, even with metrics off.
	if err := copyCerts(certDir, metricsCertDir); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, kueueConfig, webhookPort, certDir), 0o600); err != nil {
		return nil, err
	}
	logFile, err := os.Create(filepath.Join(dir, "kueue.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(framework.Bin("kueue"), "--config="+cfgPath, "--zap-log-level=3",
		"--feature-gates=KueueDRAIntegrationConsumableCapacity=true,VisibilityOnDemand=false")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+framework.Kubeconfig())
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		_ = logFile.Close()
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		select {
		case <-exited:
			return false, fmt.Errorf("kueue exited; see %s", logFile.Name())
		default:
		}
		resp, err := http.Get("http://" + healthAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err == nil {
		err = installWebhooks(ctx, caPEM)
	}
	if err != nil {
		stop()
		return nil, fmt.Errorf("starting Kueue: %w", err)
	}
	return stop, nil
}

// writeServingCert writes a CA-signed certificate for 127.0.0.1 where Kueue's webhook server
// reads it (tls.crt, tls.key) and returns the CA for the webhook configurations.
func writeServingCert(dir string) ([]byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fgpu-e2e-kueue-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kueue-webhook"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tls.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), nil
}

// copyCerts copies tls.crt and tls.key from one directory to another, which it creates.
func copyCerts(from, to string) error {
	if err := os.MkdirAll(to, 0o700); err != nil {
		return err
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		raw, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(to, f), raw, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// installWebhooks registers Kueue's Job and Pod webhooks (the paths of its
// config/components/webhook manifests) at 127.0.0.1, for the managed namespaces only: they
// suspend new Jobs and gate new Pods until Kueue admits them.
func installWebhooks(ctx context.Context, caPEM []byte) error {
	managed := &metav1.LabelSelector{MatchLabels: map[string]string{managedLabel: "managed"}}
	cfg := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: ptr.To(fmt.Sprintf("https://127.0.0.1:%d%s", webhookPort, path)), CABundle: caPEM}
	}
	rule := func(group, version, resource string, ops ...admissionregistrationv1.OperationType) []admissionregistrationv1.RuleWithOperations {
		return []admissionregistrationv1.RuleWithOperations{{Operations: ops, Rule: admissionregistrationv1.Rule{
			APIGroups: []string{group}, APIVersions: []string{version}, Resources: []string{resource}}}}
	}
	none := ptr.To(admissionregistrationv1.SideEffectClassNone)
	fail := ptr.To(admissionregistrationv1.Fail)
	create, update := admissionregistrationv1.Create, admissionregistrationv1.Update
	mutating := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "mjob.kb.io", ClientConfig: cfg("/mutate-batch-v1-job"), Rules: rule("batch", "v1", "jobs", create),
				NamespaceSelector: managed, SideEffects: none, FailurePolicy: fail, AdmissionReviewVersions: []string{"v1"}},
			{Name: "mpod.kb.io", ClientConfig: cfg("/mutate--v1-pod"), Rules: rule("", "v1", "pods", create),
				NamespaceSelector: managed, SideEffects: none, FailurePolicy: fail, AdmissionReviewVersions: []string{"v1"}},
		},
	}
	validating := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhookName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{
			{Name: "vjob.kb.io", ClientConfig: cfg("/validate-batch-v1-job"), Rules: rule("batch", "v1", "jobs", create, update),
				NamespaceSelector: managed, SideEffects: none, FailurePolicy: fail, AdmissionReviewVersions: []string{"v1"}},
			{Name: "vpod.kb.io", ClientConfig: cfg("/validate--v1-pod"), Rules: rule("", "v1", "pods", create, update),
				NamespaceSelector: managed, SideEffects: none, FailurePolicy: fail, AdmissionReviewVersions: []string{"v1"}},
		},
	}
	adm := cluster.Client.AdmissionregistrationV1()
	if _, err := adm.MutatingWebhookConfigurations().Create(ctx, mutating, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := adm.ValidatingWebhookConfigurations().Create(ctx, validating, metav1.CreateOptions{})
	return err
}

// removeKueue removes what the suite added besides the chart: the webhooks first (no one
// serves them once Kueue stops), then Kueue itself and its CRDs. Each test deletes its
// Kueue objects while Kueue runs, which takes their finalizers off.
func removeKueue(ctx context.Context, stop func()) error {
	adm := cluster.Client.AdmissionregistrationV1()
	var errs []string
	if err := adm.MutatingWebhookConfigurations().Delete(ctx, webhookName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err.Error())
	}
	if err := adm.ValidatingWebhookConfigurations().Delete(ctx, webhookName, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err.Error())
	}
	if stop != nil {
		stop()
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := os.Remove(filepath.Join(metricsCertDir, f)); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err.Error())
		}
	}
	// Only if empty: the directories may hold someone else's files.
	_ = os.Remove(metricsCertDir)
	_ = os.Remove(filepath.Dir(metricsCertDir))
	_ = os.Remove(filepath.Dir(filepath.Dir(metricsCertDir)))
	if mod, err := kueueModule(ctx); err != nil {
		errs = append(errs, err.Error())
	} else if _, err := framework.Run(ctx, framework.Bin("kubectl"), "delete", "--ignore-not-found", "--timeout=60s",
		"-f", filepath.Join(mod, "config", "components", "crd", "bases")); err != nil {
		errs = append(errs, err.Error())
	}
	if err := cluster.Client.CoreV1().Namespaces().Delete(ctx, "kueue-system", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return nil
}

// kueueLogTail is the end of Kueue's log, for failures.
func kueueLogTail() string {
	raw, _ := os.ReadFile(filepath.Join(framework.RepoRoot(), "_output", "kueue", "kueue.log"))
	if i := len(raw) - 6000; i > 0 {
		raw = raw[i:]
	}
	return string(bytes.TrimSpace(raw))
}
