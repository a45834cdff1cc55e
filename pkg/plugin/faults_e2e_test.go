//go:build fgpu_e2e

package plugin

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestE2EBuildRegistersThePauseHook(t *testing.T) {
	if p, ok := faults.(pauseFile); !ok || p.trigger != pauseTrigger {
		t.Fatalf("faults = %#v, want the pause file at %s", faults, pauseTrigger)
	}
}

func TestPauseFileBlocksWhileTheTriggerExists(t *testing.T) {
	trigger := filepath.Join(t.TempDir(), "pause")
	p := pauseFile{trigger: trigger}
	ctx := context.Background()
	p.PrepareApplied(ctx) // no trigger: returns at once

	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { p.PrepareApplied(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(trigger + ".paused"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("never marked the pause")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-done:
		t.Fatal("returned while the trigger exists")
	case <-time.After(200 * time.Millisecond):
	}
	os.Remove(trigger)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("still paused after the trigger was removed")
	}
	if _, err := os.Stat(trigger + ".paused"); !os.IsNotExist(err) {
		t.Fatalf("the pause mark outlived the pause: %v", err)
	}

	if err := os.WriteFile(trigger, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	p.PrepareApplied(cctx) // a cancelled prepare does not wait for the trigger
}
