package loadgen

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestPerClaimFromMetrics(t *testing.T) {
	before := parseMetrics(`# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 10.5
fgpu_allocator_claims_placed_total 0
fgpu_allocator_api_writes_total{resource="resourceclaims",verb="update"} 2
`)
	after := parseMetrics(`process_cpu_seconds_total 12.5
fgpu_allocator_claims_placed_total 1000
fgpu_allocator_api_writes_total{resource="events",verb="create"} 1000
fgpu_allocator_api_writes_total{resource="resourceclaims",verb="update"} 1002
fgpu_allocator_api_writes_total{resource="resourceclaims/status",verb="update"} 1000
`)
	got := PerClaim(before, after, 1000)
	for _, want := range []string{"1000 claims placed", "CPU 2.00s, 2.00 ms per claim", "writes 3000, 3.00 per claim", "create events 1.00", "update resourceclaims 1.00", "update resourceclaims/status 1.00"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q does not say %q", got, want)
		}
	}
}

func TestProcCPU(t *testing.T) {
	cpu, err := procCPU(os.Getpid())
	if err != nil {
		t.Skip(err) // no /proc here
	}
	if cpu < 0 || cpu > time.Hour {
		t.Errorf("CPU %s", cpu)
	}
}
