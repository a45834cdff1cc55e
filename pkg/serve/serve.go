// Package serve holds what fgpu's daemons share around their main loop: the Kubernetes
// client configuration and the /metrics, /healthz (and optional pprof) endpoint.
package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// RestConfig loads a kubeconfig, or the in-cluster config when kubeconfig is empty.
func RestConfig(kubeconfig, userAgent string, qps float32, burst int) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, err
	}
	cfg.UserAgent = userAgent
	// Protobuf costs the API server a fraction of JSON's CPU per request and per watch
	// event, and kube-scheduler already watches claims, pods and slices in it (one cached
	// encoding serves every watcher). CRDs speak JSON only: their clients set it on a copy.
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	if qps > 0 {
		cfg.QPS, cfg.Burst = qps, burst
	}
	return cfg, nil
}

// Registry is a Prometheus registry with the Go runtime and process collectors.
func Registry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// Metrics serves /metrics and /healthz (and pprof under /debug/pprof/ when profiling) until
// the returned function is called. /metrics and pprof name namespaces and claims, so they
// are served over HTTPS to callers the API server authenticates (TokenReview) and
// authorizes for the non-resource URL (SubjectAccessReview) through client; /healthz is
// open for the kubelet's probes. With opts.Insecure everything is plain HTTP and open.
func Metrics(ctx context.Context, opts MetricsOptions, reg *prometheus.Registry, client kubernetes.Interface) (stop func(), err error) {
	if opts.Addr == "" {
		return func() {}, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	if opts.Profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Addr: opts.Addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if !opts.Insecure {
		authn, authz, err := delegatedAuth(client)
		if err != nil {
			return nil, err
		}
		cert, err := opts.servingCert()
		if err != nil {
			return nil, err
		}
		srv.Handler = delegated(authn, authz, mux)
		srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("metrics endpoint: %w", err)
	}
	go func() {
		var err error
		if opts.Insecure {
			err = srv.Serve(ln)
		} else {
			err = srv.ServeTLS(ln, "", "")
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "addr", opts.Addr)
		}
	}()
	return func() { _ = srv.Shutdown(context.Background()) }, nil
}
