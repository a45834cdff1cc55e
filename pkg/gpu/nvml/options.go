// Package nvml is the gpu.Backend for real NVIDIA GPUs, built on NVML through
// github.com/NVIDIA/go-nvml.
//
// go-nvml needs cgo (it dlopens libnvidia-ml.so.1), so everything that touches
// it is built only with cgo. Without cgo the package still compiles, but Open
// returns an error; New, which takes a go-nvml Interface, exists only with cgo.
// This file holds what both builds share.
package nvml

import (
	"errors"
	"os"

	"k8s.io/klog/v2"
)

const (
	// DefaultDevRoot is where the NVIDIA device nodes are looked for.
	DefaultDevRoot = "/dev"
	// DefaultMPSControlBinary is the MPS control daemon's binary, found on PATH.
	DefaultMPSControlBinary = "nvidia-cuda-mps-control"
	// DefaultSysfsRoot is where the PCI devices are looked up. A container's own /sys is
	// enough: the kernel shows every container the host's PCI tree.
	DefaultSysfsRoot = "/sys"
)

// ErrNotAvailable is wrapped by the error Open and New return when the NVML
// library cannot be loaded or initialised, so callers can fall back or explain.
var ErrNotAvailable = errors.New("NVML not available: is the NVIDIA driver installed and the plugin container given the driver libraries?")

// Option configures the backend.
type Option func(*options)

type options struct {
	devRoot     string
	pathExists  func(string) bool
	mpsControl  string
	libraryPath string
	sysfsRoot   string
	logger      klog.Logger
}

func defaultOptions() options {
	return options{
		devRoot:    DefaultDevRoot,
		pathExists: pathExists,
		mpsControl: DefaultMPSControlBinary,
		sysfsRoot:  DefaultSysfsRoot,
		logger:     klog.Background(),
	}
}

// WithDevRoot sets the directory the device nodes (nvidia<N>, nvidiactl,
// nvidia-uvm, nvidia-uvm-tools) are looked for in and reported under.
func WithDevRoot(dir string) Option {
	return func(o *options) { o.devRoot = dir }
}

// WithPathExists replaces the check that decides whether a device node exists.
// It is given the full path (under the dev root). Tests use it; so can a caller
// that reports /dev paths but must look for them elsewhere (say /host/dev).
func WithPathExists(exists func(path string) bool) Option {
	return func(o *options) { o.pathExists = exists }
}

// WithMPSControlBinary sets the path MPSControlBinary returns.
func WithMPSControlBinary(path string) Option {
	return func(o *options) { o.mpsControl = path }
}

// WithLibraryPath makes Open load NVML from path instead of the default
// libnvidia-ml.so.1 found by the dynamic loader. New ignores it.
func WithLibraryPath(path string) Option {
	return func(o *options) { o.libraryPath = path }
}

func pathExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// WithSysfsRoot sets where sysfs is read for each GPU's PCIe root.
func WithSysfsRoot(dir string) Option {
	return func(o *options) { o.sysfsRoot = dir }
}

// WithLogger sets the logger that says which GPU's topology attributes could not be read.
func WithLogger(logger klog.Logger) Option {
	return func(o *options) { o.logger = logger }
}
