//go:build fgpu_e2e

package plugin

import (
	"context"
	"os"
	"time"

	"k8s.io/klog/v2"
)

// pauseTrigger is the file that pauses a prepare in an e2e build: it lies in the chart's
// state directory, which the plugin's container mounts from the host, so the e2e crash
// test creates it there (e2e/framework.PauseTrigger).
const pauseTrigger = "/var/run/fgpu/test-pause-prepare"

func init() { faults = pauseFile{trigger: pauseTrigger} }

// pauseFile blocks a prepare while its trigger file exists, and marks the pause with
// <trigger>.paused so the test knows the plugin is there.
type pauseFile struct{ trigger string }

func (p pauseFile) PrepareApplied(ctx context.Context) {
	if _, err := os.Stat(p.trigger); err != nil {
		return
	}
	logger := klog.FromContext(ctx)
	paused := p.trigger + ".paused"
	if err := os.WriteFile(paused, nil, 0o644); err != nil {
		logger.Error(err, "Test hook: cannot signal the pause, not pausing")
		return
	}
	defer os.Remove(paused)
	logger.Info("Test hook: pausing prepare", "trigger", p.trigger)
	for {
		if _, err := os.Stat(p.trigger); err != nil || ctx.Err() != nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}
