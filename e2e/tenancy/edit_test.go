package tenancy

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/e2e/framework"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/client/clientset/versioned"
)

// Finding 10 and "Also": what `edit` in one namespace cannot do, tried as that tenant.
func TestEditCannot(t *testing.T) {
	useMode(t, allocatorMode)
	ctx := context.Background()
	ns := cluster.Namespace(t, "edit")
	tenant := cluster.Tenant(t, ns, "attacker")

	t.Run("write claim status", func(t *testing.T) {
		pod, err := framework.MakeGPUPod(ns, "p").Memory("10Gi").CreateAs(ctx, tenant.Client)
		if err != nil {
			t.Fatal(err)
		}
		running(t, ns, "p")
		claim, err := cluster.ClaimOf(ctx, pod)
		if err != nil {
			t.Fatal(err)
		}
		claim.Status.Allocation.Devices.Results[0].ConsumedCapacity = nil
		_, err = tenant.Client.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, claim, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("the tenant updated its claim's status: %v", err)
		}
		healthy(t, ns)
	})

	t.Run("write SharingPolicies", func(t *testing.T) {
		fgpu, err := versioned.NewForConfig(tenant.Config)
		if err != nil {
			t.Fatal(err)
		}
		_, err = fgpu.FgpuV1alpha1().SharingPolicies().Create(ctx, builders.MakePolicy("e2e-tenancy-by-tenant").Obj(), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("the tenant created a SharingPolicy: %v", err)
		}
		createPolicy(t, builders.MakePolicy("e2e-tenancy-admins").QuotaMemory("10Gi").Namespaces("fgpu.dev/e2e-tenancy-nobody", "x").Obj())
		_, err = fgpu.FgpuV1alpha1().SharingPolicies().Patch(ctx, "e2e-tenancy-admins", types.MergePatchType,
			[]byte(`{"spec":{"quota":{"memory":"1Ti"}}}`), metav1.PatchOptions{})
		if !apierrors.IsForbidden(err) {
			t.Errorf("the tenant patched a SharingPolicy: %v", err)
		}
	})

	t.Run("tolerate the fence", func(t *testing.T) {
		fence := resourceapi.DeviceToleration{Key: api.FenceTaintKey, Operator: resourceapi.DeviceTolerationOpExists}
		_, err := tenant.Client.ResourceV1().ResourceClaims(ns).Create(ctx, builders.MakeClaim(ns, "fence").Toleration(fence).Obj(), metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), api.FenceTaintKey) {
			t.Errorf("claim tolerating the fence: want a refusal naming %s, got %v", api.FenceTaintKey, err)
		}
		tmpl := framework.MakeGPUPod(ns, "fence").Memory("10Gi").Template()
		tmpl.Spec.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
		_, err = tenant.Client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), api.FenceTaintKey) {
			t.Errorf("template with a keyless toleration: want a refusal naming %s, got %v", api.FenceTaintKey, err)
		}
	})

	t.Run("read the allocator's metrics", func(t *testing.T) {
		token, err := tenant.Token(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, who := range []struct{ name, token string }{{"no token", ""}, {"the tenant's token", token}} {
			code, body, err := getMetrics(ctx, who.token)
			if err != nil {
				t.Fatalf("allocator /metrics: %v", err)
			}
			if code != http.StatusUnauthorized && code != http.StatusForbidden {
				t.Errorf("allocator /metrics with %s: HTTP %d, want 401 or 403 (%d bytes, namespaces exposed: %v)",
					who.name, code, len(body), strings.Contains(body, ns))
			}
		}
	})
}

// getMetrics reads the allocator's /metrics on this host (it runs on the host network) over
// HTTPS, or plain HTTP where it serves no TLS.
func getMetrics(ctx context.Context, token string) (int, string, error) {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test only reads the status code
	}}
	var errs []string
	for _, scheme := range []string{"https", "http"} {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://127.0.0.1:9465/metrics", nil)
		if err != nil {
			return 0, "", err
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := client.Do(req)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		return resp.StatusCode, string(body), nil
	}
	return 0, "", fmt.Errorf("%s", strings.Join(errs, "; "))
}
