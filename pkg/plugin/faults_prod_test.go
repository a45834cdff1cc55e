//go:build !fgpu_e2e

package plugin

import "testing"

// Production builds carry no fault injector: a prepare never waits on a test's file.
func TestProductionBuildHasNoFaultInjector(t *testing.T) {
	if faults != nil {
		t.Fatalf("a build without -tags fgpu_e2e registered fault injector %T", faults)
	}
}
