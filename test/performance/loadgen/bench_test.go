package loadgen

import (
	"context"
	"runtime"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes/fake"

	"github.com/fgpu-dev/fgpu/pkg/controller"
)

// fakeAPIServer is NewSimpleClientset, not NewClientset: NewClientset's field-managed
// tracker builds a REST mapper of the whole scheme on every write (client-go v0.37), which
// slowed creating this burst from milliseconds to seconds, so the figures (and the burst
// TestFakeBurst stands the allocator up against) would be the fake server's.
func fakeAPIServer() *fake.Clientset { return fake.NewSimpleClientset() }

// burst runs the allocator in-process over a fake API server and measures a burst.
func burst(tb testing.TB, o Options) (Report, uint64) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fakeAPIServer()
	if err := Setup(ctx, client, o); err != nil {
		tb.Fatal(err)
	}
	cfg := controller.DefaultConfig()
	c := controller.New(cfg, client, nil, nil)
	go func() { _ = c.Run(ctx) }()
	for !c.Synced() {
		time.Sleep(10 * time.Millisecond)
	}
	rep, err := Burst(ctx, client, o)
	if err != nil {
		tb.Fatal(err)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	return rep, after.HeapInuse
}

func TestFakeBurst(t *testing.T) {
	o := Defaults()
	o.Nodes, o.Claims, o.Timeout = 20, 200, time.Minute
	rep, _ := burst(t, o)
	t.Log(rep)
	if rep.Allocated != o.Claims {
		t.Fatalf("allocated %d of %d", rep.Allocated, o.Claims)
	}
	if rep.InvariantErr != nil {
		t.Fatal(rep.InvariantErr)
	}
}

// BenchmarkBurst2000 is the figure: 2,000 claims over 500 nodes × 8 GPUs, against
// a fake API server (so it measures the allocator, not an API server).
func BenchmarkBurst2000(b *testing.B) {
	for i := 0; i < b.N; i++ {
		o := Defaults()
		rep, heap := burst(b, o)
		if rep.Allocated != rep.Claims || rep.InvariantErr != nil {
			b.Fatal(rep)
		}
		b.ReportMetric(rep.PerSecond, "claims/s")
		b.ReportMetric(float64(rep.P99.Milliseconds()), "p99-ms")
		b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
		b.Log(rep)
	}
}

// BenchmarkAllocatorHeap4000GPUs estimates the allocator's own memory at 500 nodes × 8
// GPUs with 2,000 placed claims and their pods: the heap after it placed them all, less
// the heap of the fake API server already holding every object before it started.
func BenchmarkAllocatorHeap4000GPUs(b *testing.B) {
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithCancel(context.Background())
		o := Defaults()
		client := fakeAPIServer()
		if err := Setup(ctx, client, o); err != nil {
			b.Fatal(err)
		}
		if err := CreateAll(ctx, client, o); err != nil {
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		c := controller.New(controller.DefaultConfig(), client, nil, nil)
		start := time.Now()
		go func() { _ = c.Run(ctx) }()
		rep := Await(ctx, client, o, start)
		if rep.Allocated != o.Claims || rep.InvariantErr != nil {
			b.Fatal(rep)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		b.ReportMetric(float64(after.HeapInuse-before.HeapInuse)/(1<<20), "allocator-heap-MiB")
		b.ReportMetric(rep.PerSecond, "claims/s")
		b.Log(rep)
		runtime.KeepAlive(c)
		cancel()
	}
}
