// Command fgpu-probe is the workload of fgpu's demo and e2e tests: it prints what its
// container received from fgpu (CUDA_MPS_* and FGPU_* variables, GPU device nodes, the MPS
// mounts, the driver's files), once as text for people and once as a JSON line for tests, then sleeps.
//
// With --replay-usage STEPS --usage-dir DIR [--speed N] [--gpu I] it then plays a usage
// pattern on a fake GPU (DIR: the plugin's fake device directory, mounted; the pod needs
// hostPID so that its PID is the node's): "SECONDS:MEMORY:SM,..." reported as its own use, N
// times faster, failing with "out of memory" (exit status 2) past its MPS memory cap. The GPU
// is the one fgpu gave the container, or fake GPU I, for a pod fgpu did not serve.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
)

// Report is the JSON line's content.
type Report struct {
	Env     map[string]string `json:"env"`
	Devices []string          `json:"devices"`
	Mounts  []string          `json:"mounts"`
	// PipeDirWritable says whether the MPS pipe directory is usable by the container.
	PipeDirWritable bool `json:"pipeDirWritable"`
	// DriverFiles are the files of DriverPaths that exist in the container.
	DriverFiles []string `json:"driverFiles"`
	// ShmFile is a file the probe wrote in its /dev/shm, which it shares with its MPS server.
	ShmFile string `json:"shmFile,omitempty"`
}

// DriverPaths are where a CUDA image expects the NVIDIA driver: the loader's directory of a
// Debian or Ubuntu based image, and the one NVIDIA's images put on LD_LIBRARY_PATH.
var DriverPaths = []string{
	"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
	"/usr/lib/x86_64-linux-gnu/libcuda.so",
	"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
	"/usr/local/nvidia/lib64/libcuda.so.1",
	"/usr/local/nvidia/lib64/libnvidia-ml.so.1",
	"/usr/bin/nvidia-smi",
	"/run/nvidia-persistenced/socket",
}

func main() {
	r := Report{Env: map[string]string{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "CUDA_") || strings.HasPrefix(k, "FGPU_") {
			r.Env[k] = v
		}
	}
	r.Devices, _ = filepath.Glob("/dev/nvidia*")
	r.Mounts = mounts()
	for _, p := range DriverPaths {
		if _, err := os.Stat(p); err == nil {
			r.DriverFiles = append(r.DriverFiles, p)
		}
	}
	if dir := r.Env["CUDA_MPS_PIPE_DIRECTORY"]; dir != "" {
		f, err := os.CreateTemp(dir, ".probe-*")
		if err == nil {
			r.PipeDirWritable = true
			f.Close()
			os.Remove(f.Name())
		}
	}

	if r.Env["CUDA_MPS_PIPE_DIRECTORY"] != "" {
		host, _ := os.Hostname()
		name := "/dev/shm/fgpu-probe-" + host
		if err := os.WriteFile(name, []byte(host), 0o644); err == nil {
			r.ShmFile = name
		}
	}

	for _, k := range slices.Sorted(maps.Keys(r.Env)) {
		fmt.Printf("env    %s=%s\n", k, r.Env[k])
	}
	for _, d := range r.Devices {
		fmt.Printf("device %s\n", d)
	}
	for _, m := range r.Mounts {
		fmt.Printf("mount  %s\n", m)
	}
	for _, f := range r.DriverFiles {
		fmt.Printf("driver %s\n", f)
	}
	raw, _ := json.Marshal(r)
	fmt.Printf("FGPU-PROBE %s\n", raw)

	fs := flag.NewFlagSet("fgpu-probe", flag.ExitOnError)
	once := fs.Bool("once", false, "exit after the report")
	stepsFlag := fs.String("replay-usage", "", "usage pattern to play on a fake GPU: SECONDS:MEMORY:SM,...")
	devDir := fs.String("usage-dir", "", "the fake GPUs' device directory (the plugin's --dev-root)")
	speed := fs.Float64("speed", 1, "play the pattern this many times faster")
	onGPU := fs.Int("gpu", -1, "replay on this fake GPU (its index) instead of the one fgpu gave the container: a process fgpu did not start, as a device plugin's pod's")
	_ = fs.Parse(os.Args[1:])
	if *once {
		return
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	if *stepsFlag == "" {
		<-sig
		return
	}
	steps, err := parseSteps(*stepsFlag)
	if err == nil && (*devDir == "" || *speed <= 0) {
		err = errors.New("--replay-usage needs --usage-dir and a positive --speed")
	}
	index := *onGPU
	if err == nil && index < 0 {
		index, err = gpuIndex(r.Devices)
	}
	if err == nil {
		err = replay(steps, *devDir, index, *speed, sig)
	}
	if errors.Is(err, fake.ErrOutOfMemory) {
		fmt.Fprintln(os.Stderr, "fgpu-probe:", err)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fgpu-probe:", err)
		os.Exit(1)
	}
}

// mounts lists the mount points fgpu is responsible for: the MPS directories and /dev/shm.
func mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := fields[4]
		if strings.Contains(mp, "/fgpu/") || mp == "/dev/shm" {
			out = append(out, mp)
		}
	}
	return out
}
