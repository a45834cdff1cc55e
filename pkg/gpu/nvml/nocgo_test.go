//go:build !cgo

package nvml

import (
	"errors"
	"testing"
)

func TestOpenWithoutCgo(t *testing.T) {
	b, err := Open()
	if b != nil || !errors.Is(err, ErrNotAvailable) {
		t.Fatalf("Open() = %v, %v; want nil and ErrNotAvailable", b, err)
	}
}
