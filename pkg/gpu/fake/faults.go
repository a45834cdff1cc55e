package fake

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

var _ gpu.HealthMonitor = (*Backend)(nil)

// FaultFile is where a fake GPU's faults are written, one a line: "xid <number>" or the
// name of another kind ("ecc-dbe", "lost", "row-remap-failure", "thermal", "power"),
// optionally followed by a detail. An XID may name the recovery action its driver gives with
// it ("xid 13 action=gpu-reset"), as NVML's recovery action field does; without one the fake
// GPU is a driver that gives none, and the XID catalog decides. The GPU is in those
// conditions while the lines stand, and healthy again once they are removed (or the file
// is): e.g.
//
//	echo "xid 79" >> /var/run/fgpu/fake-dev/nvidia0.faults
//	rm /var/run/fgpu/fake-dev/nvidia0.faults
func FaultFile(devDir string, index int) string {
	return filepath.Join(devDir, fmt.Sprintf("nvidia%d.faults", index))
}

// ParseFault reads one line of a fault file.
func ParseFault(line string) (gpu.Fault, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return gpu.Fault{}, errors.New("empty fault")
	}
	f := gpu.Fault{Kind: gpu.FaultKind(fields[0])}
	rest := fields[1:]
	switch {
	case f.Kind == gpu.FaultXID:
		if len(rest) == 0 {
			return gpu.Fault{}, fmt.Errorf("fault %q: xid needs its number, e.g. \"xid 79\"", line)
		}
		n, err := strconv.ParseUint(rest[0], 10, 32)
		if err != nil {
			return gpu.Fault{}, fmt.Errorf("fault %q: %q is not an XID number", line, rest[0])
		}
		f.XID, rest = n, rest[1:]
		if len(rest) > 0 {
			if a, ok := strings.CutPrefix(rest[0], "action="); ok {
				f.Action, rest = gpu.RecoveryAction(a), rest[1:]
				if !slices.Contains(gpu.RecoveryActions, f.Action) {
					return gpu.Fault{}, fmt.Errorf("fault %q: unknown recovery action %q (known: %s)", line, a, actionNames())
				}
			}
		}
	case !slices.Contains(gpu.FaultKinds, f.Kind):
		return gpu.Fault{}, fmt.Errorf("fault %q: unknown kind %q (known: xid <n> [action=<recovery action>], ecc-dbe, lost, row-remap-failure, thermal, power)", line, fields[0])
	}
	f.Detail = strings.Join(rest, " ")
	return f, nil
}

func actionNames() string {
	var names []string
	for _, a := range gpu.RecoveryActions {
		names = append(names, string(a))
	}
	return strings.Join(names, ", ")
}

// Faults implements gpu.HealthMonitor: the lines of each GPU's FaultFile. A GPU whose file
// cannot be read, or has a line that is no fault, is unreadable as a whole.
func (b *Backend) Faults() (map[string][]gpu.Fault, map[string]error) {
	out := map[string][]gpu.Fault{}
	errs := map[string]error{}
	for _, d := range b.devices {
		raw, err := os.ReadFile(FaultFile(b.devDir, d.Index))
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs[d.UUID] = fmt.Errorf("read fake GPU faults: %w", err)
			continue
		}
		now := time.Now()
		var fs []gpu.Fault
		for _, line := range strings.Split(string(raw), "\n") {
			if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			f, err := ParseFault(line)
			if err != nil {
				errs[d.UUID] = fmt.Errorf("%s: %w", FaultFile(b.devDir, d.Index), err)
				break
			}
			f.Since = now
			fs = append(fs, f)
		}
		if errs[d.UUID] == nil && len(fs) > 0 {
			out[d.UUID] = fs
		}
	}
	return out, errs
}

// ClearFaults implements gpu.HealthMonitor: a fake GPU latches nothing; its faults go
// with their lines.
func (b *Backend) ClearFaults(string) error { return nil }

// InjectFault appends a fault to a fake GPU's fault file (fgpu faults inject).
func InjectFault(devDir string, index int, line string) error {
	if _, err := ParseFault(line); err != nil {
		return err
	}
	f, err := os.OpenFile(FaultFile(devDir, index), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("inject fake GPU fault: %w", err)
	}
	if _, err := fmt.Fprintln(f, strings.TrimSpace(line)); err != nil {
		f.Close()
		return fmt.Errorf("inject fake GPU fault: %w", err)
	}
	return f.Close()
}

// RemoveFaults clears a fake GPU's faults (fgpu faults recover).
func RemoveFaults(devDir string, index int) error {
	if err := os.Remove(FaultFile(devDir, index)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("clear fake GPU faults: %w", err)
	}
	return nil
}
