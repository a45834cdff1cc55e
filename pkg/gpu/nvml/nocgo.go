//go:build !cgo

package nvml

import (
	"fmt"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// Open would load the host's NVML library, but NVML is reached through cgo and
// this binary was built without it (CGO_ENABLED=0).
func Open(opts ...Option) (gpu.Backend, error) {
	return nil, fmt.Errorf("%w (this binary was built without cgo, which NVML needs)", ErrNotAvailable)
}
