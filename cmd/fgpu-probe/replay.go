package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// step is one point of a replayed usage pattern: from At on, the workload uses Memory and SM.
type step struct {
	At     time.Duration
	Memory int64
	SM     int
}

// parseSteps reads "SECONDS:MEMORY:SM,..." (e.g. "0:2Gi:30,600:6Gi:50"), times in order.
func parseSteps(s string) ([]step, error) {
	var out []step
	for _, part := range strings.Split(s, ",") {
		f := strings.Split(strings.TrimSpace(part), ":")
		if len(f) != 3 {
			return nil, fmt.Errorf("usage step %q: want SECONDS:MEMORY:SM", part)
		}
		sec, err1 := strconv.ParseFloat(f[0], 64)
		mem, err2 := resource.ParseQuantity(f[1])
		sm, err3 := strconv.Atoi(f[2])
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, fmt.Errorf("usage step %q: %w", part, err)
		}
		st := step{At: time.Duration(sec * float64(time.Second)), Memory: mem.Value(), SM: sm}
		if st.Memory < 0 || sm < 0 || sm > 100 || len(out) > 0 && st.At < out[len(out)-1].At {
			return nil, fmt.Errorf("usage step %q: out of range or out of order", part)
		}
		out = append(out, st)
	}
	return out, nil
}

var mpsLimitRE = regexp.MustCompile(`^0=(\d+)([MG])$`)

// mpsCap is the memory cap MPS gives this process, from CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
// ("0=10240M"); 0 without one.
func mpsCap(env string) int64 {
	m := mpsLimitRE.FindStringSubmatch(env)
	if m == nil {
		return 0
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	if m[2] == "G" {
		return n << 30
	}
	return n << 20
}

// gpuIndex is the index of the one GPU device node the container got (/dev/nvidiaN).
func gpuIndex(devices []string) (int, error) {
	for _, d := range devices {
		if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "nvidia")); err == nil {
			return n, nil
		}
	}
	return 0, errors.New("no /dev/nvidiaN in the container")
}

// replay reports the steps' usage to the fake GPU as this process's, speed times faster than
// the pattern's clock, then holds the last step until stop. Past the MPS cap it fails as a
// CUDA allocation would.
func replay(steps []step, devDir string, index int, speed float64, stop <-chan os.Signal) error {
	pid, limit := os.Getpid(), mpsCap(os.Getenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
	defer func() { _ = fake.ReportUsage(devDir, index, pid, 0, -1, 0) }()
	start := time.Now()
	for _, st := range steps {
		wait := time.Until(start.Add(time.Duration(float64(st.At) / speed)))
		select {
		case <-stop:
			return nil
		case <-time.After(wait):
		}
		if err := fake.ReportUsage(devDir, index, pid, st.Memory, st.SM, limit); err != nil {
			return err
		}
		fmt.Printf("usage  %s memory=%d sm=%d\n", st.At, st.Memory, st.SM)
	}
	<-stop
	return nil
}
