package serve

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestMetricsServesRegistryAndHealth(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	reg := Registry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "fgpu_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Inc()
	stop := Metrics(context.Background(), addr, reg, false)
	defer stop()
	get := func(path string) (int, string) {
		var resp *http.Response
		for i := 0; i < 50; i++ {
			if resp, err = http.Get("http://" + addr + path); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get("/metrics"); code != 200 || !strings.Contains(body, "fgpu_test_total 1") || !strings.Contains(body, "go_goroutines") {
		t.Fatalf("/metrics: %d %s", code, body[:min(len(body), 200)])
	}
	if code, body := get("/healthz"); code != 200 || body != "ok" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _ := get("/debug/pprof/"); code != 404 {
		t.Fatalf("pprof served without profiling: %d", code)
	}
}
