package main

import (
	"slices"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

// TestTaintingJudgesAsThePlugin: the faults check's false-alarm verdict counts only what the
// plugin would taint a GPU for, so a passing slowdown under load is not a false alarm.
func TestTaintingJudgesAsThePlugin(t *testing.T) {
	thermal := gpu.Fault{Kind: gpu.FaultThermal}
	appXID := gpu.Fault{Kind: gpu.FaultXID, XID: 31}
	fatal := gpu.Fault{Kind: gpu.FaultXID, XID: 79}
	cases := []struct {
		name     string
		readings [][]gpu.Fault
		want     int
	}{
		{"an application's XID", [][]gpu.Fault{{appXID}, {appXID}, {appXID}, {appXID}}, 0},
		{"a slowdown one poll short of the plugin's damping", slices.Repeat([][]gpu.Fault{{thermal}}, plugin.SlowdownPolls-1), 0},
		{"a slowdown that comes and goes", [][]gpu.Fault{{thermal}, {thermal}, {}, {thermal}, {thermal}, {}}, 0},
		{"a slowdown held as long as the plugin waits", slices.Repeat([][]gpu.Fault{{thermal}}, plugin.SlowdownPolls), 1},
		{"a fatal XID, once", [][]gpu.Fault{{}, {fatal}, {}}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dev := gpu.Device{Index: 0, UUID: "GPU-0"}
			start := time.Unix(1000, 0)
			c := &faultsCheck{devs: []gpu.Device{dev}, start: start}
			for i, fs := range tc.readings {
				c.health = append(c.health, healthReading{t: start.Add(time.Duration(i) * 2 * time.Second), faults: map[string][]gpu.Fault{dev.UUID: fs}})
			}
			if got := c.tainting(start, start.Add(time.Hour)); len(got) != tc.want {
				t.Errorf("tainting = %q, want %d", got, tc.want)
			}
		})
	}
}
