package plugin

import (
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// Config is everything the kubelet plugin needs, parsed from flags by its main.
type Config struct {
	DriverName string
	NodeName   string
	// CDIDir receives one spec per prepared claim; containerd must read it.
	CDIDir string
	// PluginDataDir holds the plugin's socket and checkpoint.
	PluginDataDir string
	// RegistrarDir is the kubelet's plugin registry.
	RegistrarDir string
	// MPSRoot holds one directory per MPS daemon; it must be the same path on the host and
	// in the plugin's container, since CDI mounts name host paths.
	MPSRoot string
	// DriverRoot is the NVIDIA driver installation's root on the host ("/", or e.g.
	// /run/nvidia/driver under the GPU Operator); every claim's containers get its libraries,
	// tools and IPC sockets. Empty: none (the containers bring their own driver).
	DriverRoot string
	// DriverRootLocal is where the plugin sees DriverRoot; default DriverRoot.
	DriverRootLocal string
	// DevRoot is where the GPU device nodes live on the host; containers see them under /dev.
	DevRoot string
	// ReservedMemory is kept back from each GPU for the driver and the MPS server.
	ReservedMemory int64
	// Fenced publishes devices with the allocator taint (allocator mode).
	Fenced bool
	// OwnPIDNamespace says the plugin runs in a PID namespace of its own, not the node's
	// (InNodePIDNamespace): NVML then lists only the processes of that namespace, fgpu's own,
	// so no GPU is judged busy with foreign processes.
	OwnPIDNamespace bool
	// CgroupRoot is the node's cgroup v2 mount as the plugin sees it (/sys/fs/cgroup with the
	// host's cgroup namespace). Where its dmem controller lists a GPU, the pods of that GPU's MPS
	// claims get their caps as a cgroup limit too. Empty: per-process MPS limits only.
	CgroupRoot string
	// MPSPods, with an Image, runs each MPS control daemon in a pod of its own; without one
	// the daemons are the plugin's children (outside Kubernetes, as in the GPU check).
	MPSPods MPSPodConfig
	// MPSLauncher, where set, runs the MPS control daemons instead (MPSPods gives only their
	// shm size): the GPU check, outside Kubernetes, runs them as host processes in the shape
	// of their pods.
	MPSLauncher mps.Launcher
	// ForeignPoll is how often the GPUs are looked at for processes fgpu did not start
	// (0: DefaultForeignPoll).
	ForeignPoll time.Duration
	// HealthPoll is how often the GPUs' faults are read (0: DefaultHealthPoll).
	HealthPoll time.Duration
	// UsagePoll is how often each prepared share's GPU use is measured (0: DefaultUsagePoll;
	// negative: not measured). UsageReport is the least time between two reports of a claim's
	// use in its status, written only when the use moved beyond the thresholds or
	// UsageHeartbeat passed (0: the defaults).
	UsagePoll      time.Duration
	UsageReport    time.Duration
	UsageHeartbeat time.Duration
	// A GPU that faulted FlapCount times within FlapWindow stays fenced for FlapBackoff
	// (0: the defaults).
	FlapCount   int
	FlapWindow  time.Duration
	FlapBackoff time.Duration
}

// DefaultForeignPoll is modest: a GPU freed by someone else is offered again within it.
const DefaultForeignPoll = 10 * time.Second

func (c Config) foreignPoll() time.Duration {
	if c.ForeignPoll > 0 {
		return c.ForeignPoll
	}
	return DefaultForeignPoll
}

// CheckpointPath is where the checkpoint lives.
func (c Config) CheckpointPath() string { return filepath.Join(c.PluginDataDir, "checkpoint.json") }

func (c Config) healthPoll() time.Duration {
	if c.HealthPoll > 0 {
		return c.HealthPoll
	}
	return DefaultHealthPoll
}

func (c Config) flapCount() int {
	if c.FlapCount > 0 {
		return c.FlapCount
	}
	return DefaultFlapCount
}

func (c Config) flapWindow() time.Duration {
	if c.FlapWindow > 0 {
		return c.FlapWindow
	}
	return DefaultFlapWindow
}

func (c Config) flapBackoff() time.Duration {
	if c.FlapBackoff > 0 {
		return c.FlapBackoff
	}
	return DefaultFlapBackoff
}

// MPSPodConfig is how the MPS control daemons' pods run.
type MPSPodConfig struct {
	// Namespace is the plugin's own: the daemons' pods are created there.
	Namespace string
	// Image is the plugin's image; it carries the fake GPUs' stand-in control binary.
	Image      string
	PullPolicy corev1.PullPolicy
	// DriverRoot is the host's driver root whose nvidia-cuda-mps-control the pods run
	// (real GPUs); empty: the control binary in Image (fake GPUs).
	DriverRoot string
	// HostPaths are host directories the daemons need at their own paths.
	HostPaths []string
	// ShmSize is the size of each daemon's shm tmpfs, shared by its server and clients.
	ShmSize int64
	// ServiceAccount and PriorityClass of the daemons' pods (see mps.PodLauncher).
	ServiceAccount, PriorityClass string
}

func (c Config) usagePoll() time.Duration {
	if c.UsagePoll == 0 {
		return DefaultUsagePoll
	}
	return c.UsagePoll
}

func (c Config) usageReport() time.Duration {
	if c.UsageReport > 0 {
		return c.UsageReport
	}
	return DefaultUsageReport
}

func (c Config) usageHeartbeat() time.Duration {
	if c.UsageHeartbeat > 0 {
		return max(c.UsageHeartbeat, c.usageReport())
	}
	return max(DefaultUsageHeartbeat, c.usageReport())
}
