package serve

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func testRegistry() *prometheus.Registry {
	reg := Registry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "fgpu_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	return reg
}

// get fetches url with an optional bearer token, trusting any certificate.
func get(t *testing.T, url, token string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestInsecureMetricsServesRegistryAndHealth(t *testing.T) {
	addr := freeAddr(t)
	stop, err := Metrics(context.Background(), MetricsOptions{Addr: addr, Insecure: true}, testRegistry(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if code, body := get(t, "http://"+addr+"/metrics", ""); code != 200 || !strings.Contains(body, "fgpu_test_total 1") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d %s", code, body[:min(len(body), 200)])
	}
	if code, body := get(t, "http://"+addr+"/healthz", ""); code != 200 || body != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/debug/pprof/", ""); code != 404 {
		t.Fatalf("pprof served without profiling: %d", code)
	}
}

// apiServer is an API server that answers TokenReviews for the tokens "reader" and
// "nobody", and SubjectAccessReviews allowing only reader to get /metrics and pprof.
func apiServer(t *testing.T) kubernetes.Interface {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /apis/authentication.k8s.io/v1/tokenreviews", func(w http.ResponseWriter, r *http.Request) {
		var tr authnv1.TokenReview
		if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
			t.Error(err)
		}
		if user := tr.Spec.Token; user == "reader" || user == "nobody" {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, User: authnv1.UserInfo{Username: user}}
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(tr)
	})
	mux.HandleFunc("POST /apis/authorization.k8s.io/v1/subjectaccessreviews", func(w http.ResponseWriter, r *http.Request) {
		var sar authzv1.SubjectAccessReview
		if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
			t.Error(err)
		}
		nr := sar.Spec.NonResourceAttributes
		if sar.Spec.ResourceAttributes != nil || nr == nil {
			t.Errorf("want a non-resource SubjectAccessReview, got %+v", sar.Spec)
		}
		sar.Status.Allowed = sar.Spec.User == "reader" && nr != nil && nr.Verb == "get" && (nr.Path == "/metrics" || strings.HasPrefix(nr.Path, "/debug/pprof/"))
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(sar)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
}

func TestMetricsNeedAnAuthorizedToken(t *testing.T) {
	addr := freeAddr(t)
	stop, err := Metrics(context.Background(), MetricsOptions{Addr: addr, Profiling: true}, testRegistry(), apiServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	base := "https://" + addr
	if code, body := get(t, base+"/metrics", ""); code != http.StatusUnauthorized || strings.Contains(body, "fgpu_test_total") {
		t.Errorf("no token: %d %q", code, body)
	}
	if code, _ := get(t, base+"/metrics", "forged"); code != http.StatusUnauthorized {
		t.Errorf("unknown token: %d", code)
	}
	if code, body := get(t, base+"/metrics", "nobody"); code != http.StatusForbidden || !strings.Contains(body, `user "nobody" may not get the non-resource URL /metrics`) {
		t.Errorf("token without permission: %d %q", code, body)
	}
	if code, body := get(t, base+"/metrics", "reader"); code != http.StatusOK || !strings.Contains(body, "fgpu_test_total 1") {
		t.Errorf("allowed: %d %q", code, body[:min(len(body), 200)])
	}
	if code, _ := get(t, base+"/debug/pprof/", ""); code != http.StatusUnauthorized {
		t.Errorf("pprof without a token: %d", code)
	}
	if code, _ := get(t, base+"/debug/pprof/", "nobody"); code != http.StatusForbidden {
		t.Errorf("pprof without permission: %d", code)
	}
	if code, body := get(t, base+"/healthz", ""); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz is for the kubelet's probe, without a token: %d %q", code, body)
	}
	if code, _ := get(t, "http://"+addr+"/metrics", ""); code != http.StatusBadRequest {
		t.Errorf("plain HTTP on the TLS port: %d", code)
	}
}
