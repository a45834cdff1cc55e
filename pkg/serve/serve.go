// Package serve holds what fgpu's daemons share around their main loop: the Kubernetes
// client configuration and the /metrics, /healthz (and optional pprof) endpoint.
package serve

import (
	"context"
	"errors"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/runtime"
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

// Metrics serves /metrics and /healthz (and pprof under /debug/pprof/ when profiling) on
// addr until the returned function is called. An empty addr serves nothing.
func Metrics(ctx context.Context, addr string, reg *prometheus.Registry, profiling bool) (stop func()) {
	if addr == "" {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	if profiling {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			klog.FromContext(ctx).Error(err, "Metrics server stopped", "addr", addr)
		}
	}()
	return func() { _ = srv.Shutdown(context.Background()) }
}
