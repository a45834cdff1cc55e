package framework

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// Suite is what an e2e suite sets up around its tests.
type Suite struct {
	// Values are the chart values the suite installs.
	Values []string
	// Ready runs once the chart is installed: it keeps the cluster, makes the suite's
	// clients, waits for what the tests need. An error fails the suite before any test.
	Ready func(ctx context.Context, c *Cluster) error
	// Teardown runs after the tests (also after a failed Ready), before the chart is
	// uninstalled: it removes what the suite left outside the chart.
	Teardown func(ctx context.Context) error
}

// Main is every e2e suite's TestMain: it installs the chart with s.Values, runs s.Ready, the
// tests and s.Teardown, uninstalls the chart, and exits with the tests' code, or 1 where a step
// around them failed. Without a local cluster it exits 0 at once (unless FGPU_E2E requires one).
func Main(m *testing.M, s Suite) {
	c, err := Setup(s.Values...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		os.Exit(1)
	}
	if c == nil {
		os.Exit(0)
	}
	code := 1
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	if s.Ready != nil {
		err = s.Ready(ctx, c)
	}
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
	} else {
		code = m.Run()
	}
	ctx, cancel = context.WithTimeout(context.Background(), 3*time.Minute)
	if s.Teardown != nil {
		if err := s.Teardown(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "e2e teardown:", err)
			code = 1
		}
	}
	if err := c.Uninstall(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e teardown:", err)
		code = 1
	}
	cancel()
	os.Exit(code)
}
