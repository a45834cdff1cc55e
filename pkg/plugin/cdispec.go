package plugin

import (
	"fmt"
	"strconv"
	"strings"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// cdiSpecs is the CDI applier: the spec writer and how a prepared claim becomes a spec. It
// holds no state of its own (the specs on disk are the claims'), so it needs no lock.
type cdiSpecs struct {
	*cdi.Writer
	devices map[string]gpu.Device // by device name
	cfg     Config
	// mps names the daemons' directories a share's containers mount.
	mps *mps.Manager
}

// write writes the claim's spec, one CDI device per prepared device, and returns their IDs.
func (c *cdiSpecs) write(uid string, e *checkpoint.ClaimEntry) ([]string, error) {
	specs := make([]cdi.Device, 0, len(e.Devices))
	for i := range e.Devices {
		specs = append(specs, c.device(&e.Devices[i], i, len(e.Devices)))
	}
	return c.Write(uid, specs)
}

// device is what a container of the claim receives for device i of its n devices.
//
// A runtime applies all CDI devices a container names in one pass, and of two devices that set
// one variable the last applied wins. So each device sets only names no other device of the
// claim sets: FGPU_<NAME>_<i> for every claim, and the plain FGPU_<NAME> only in a claim of one
// device, where it cannot be contradicted. A container that names one request of a claim gets
// that request's devices only, and with them exactly their own variables.
func (c *cdiSpecs) device(p *checkpoint.PreparedDevice, i, n int) cdi.Device {
	d := c.devices[p.Device]
	dev := cdi.Device{Name: p.Device}
	for _, node := range d.DeviceNodes {
		dev.DeviceNodes = append(dev.DeviceNodes, cdi.DeviceNode{HostPath: node, Path: c.cfg.containerDevicePath(node)})
	}
	for _, v := range []struct{ name, value string }{
		{configapi.EnvGPUUUID, d.UUID},
		{configapi.EnvDevice, p.Device},
		{configapi.EnvShareID, p.ShareID},
		{configapi.EnvSharingMode, p.Mode},
		{configapi.EnvIsolationDomain, p.IsolationDomain},
		{configapi.EnvMemoryLimitBytes, strconv.FormatInt(p.MemoryLimitBytes, 10)},
		{configapi.EnvMemoryLimit, bytesStr(p.MemoryLimitBytes)},
		{configapi.EnvMemoryGuaranteedBytes, strconv.FormatInt(p.MemoryBytes, 10)},
		{configapi.EnvMemoryGuaranteed, bytesStr(p.MemoryBytes)},
		{configapi.EnvComputePercent, strconv.FormatInt(p.ThreadPercent, 10)},
		{configapi.EnvMemoryEnforced, strconv.FormatBool(p.MemoryEnforced)},
		{configapi.EnvMemoryEnforcement, p.MemoryEnforcement},
		{configapi.EnvMemoryCap, p.MemoryCap},
	} {
		if n == 1 {
			dev.Env = append(dev.Env, v.name+"="+v.value)
		}
		dev.Env = append(dev.Env, fmt.Sprintf("%s_%d=%s", v.name, i, v.value))
	}
	// CUDA_MPS_* come from the claim's one MPS share (plan allows no second one).
	if p.MPSKey == "" {
		return dev
	}
	pipe, logDir := c.mps.PipeDir(p.MPSKey), c.mps.LogDir(p.MPSKey)
	dev.Env = append(dev.Env,
		configapi.EnvMPSPipeDirectory+"="+pipe,
		configapi.EnvMPSLogDirectory+"="+logDir,
		fmt.Sprintf("%s=0=%dM", configapi.EnvMPSPinnedDeviceMemLimit, p.MemoryLimitBytes>>20),
	)
	if p.ThreadPercent > 0 {
		dev.Env = append(dev.Env, fmt.Sprintf("%s=%d", configapi.EnvMPSActiveThreadPercentage, p.ThreadPercent))
	}
	dev.Mounts = []cdi.Mount{
		{HostPath: pipe, ContainerPath: pipe, Options: []string{"rw", "nosuid", "nodev", "bind"}},
		{HostPath: logDir, ContainerPath: logDir, Options: []string{"ro", "nosuid", "nodev", "bind"}},
		{HostPath: c.mps.ShmDir(p.MPSKey), ContainerPath: "/dev/shm", Options: []string{"rw", "nosuid", "nodev", "bind"}},
	}
	return dev
}

func (c Config) containerDevicePath(hostPath string) string {
	if c.DevRoot == "" || c.DevRoot == "/dev" {
		return hostPath
	}
	return "/dev/" + strings.TrimPrefix(strings.TrimPrefix(hostPath, c.DevRoot), "/")
}
