package plugin

import (
	"context"
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
)

// BenchmarkPrepare measures one claim's prepare with its MPS daemon already running (the
// daemon start is a one-off per GPU and domain): plan, capacity check, two checkpoint
// writes with fsync, the CDI spec. It reports p50/p99 as well as the mean.
//
//	go test ./pkg/plugin -run '^$' -bench Prepare -benchtime 200x
func BenchmarkPrepare(b *testing.B) {
	e := newEnv(b)
	s := e.state()
	ctx := context.Background()
	warm := builders.MakeClaim("ns", "warm").Memory("256Mi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, warm); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c := builders.MakeClaim("ns", fmt.Sprintf("c%d", i)).Memory("256Mi").AllocatedOn(node, "gpu-0").Obj()
		start := time.Now()
		if _, err := s.Prepare(ctx, c); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		if len(s.cp.Claims) > 200 {
			b.StopTimer()
			for uid := range s.cp.Claims {
				if uid != string(warm.UID) {
					if err := s.Unprepare(ctx, uid); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	keys, _ := s.daemons.mps.Keys(context.Background())
	for _, k := range keys {
		if err := s.daemons.mps.Stop(ctx, k); err != nil {
			b.Fatal(err)
		}
	}
}
