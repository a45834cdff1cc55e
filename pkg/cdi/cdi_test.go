package cdi

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
)

func TestWriteIsAppliedByTheCDIRegistry(t *testing.T) {
	dir := t.TempDir()
	w, err := NewWriter(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.Write("uid-1", []Device{{
		Name:        "gpu-0",
		DeviceNodes: []DeviceNode{{HostPath: "/dev/null", Path: "/dev/nvidia0"}},
		Env:         []string{"CUDA_MPS_PIPE_DIRECTORY=/run/fgpu/mps/x/pipe", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M"},
		Mounts:      []Mount{{HostPath: "/run/fgpu/mps/x/pipe", ContainerPath: "/run/fgpu/mps/x/pipe", Options: []string{"rw", "bind"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] != "fgpu.dev/gpu=uid-1-gpu-0" {
		t.Fatalf("ids %v", ids)
	}
	// Inject the device into an OCI spec as a runtime would, from a fresh cache.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(ociSpec, ids...); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(ociSpec.Process.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M") {
		t.Fatalf("env not injected: %v", ociSpec.Process.Env)
	}
	if len(ociSpec.Mounts) != 1 || ociSpec.Mounts[0].Destination != "/run/fgpu/mps/x/pipe" {
		t.Fatalf("mounts %+v", ociSpec.Mounts)
	}
	if len(ociSpec.Linux.Devices) != 1 || ociSpec.Linux.Devices[0].Path != "/dev/nvidia0" {
		t.Fatalf("devices %+v", ociSpec.Linux.Devices)
	}

	uids, _ := w.ClaimUIDs()
	if !slices.Equal(uids, []string{"uid-1"}) {
		t.Fatalf("ClaimUIDs %v", uids)
	}
	if err := w.Remove("uid-1"); err != nil {
		t.Fatal(err)
	}
	if err := w.Remove("uid-1"); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("left %v", entries)
	}
}

func TestClaimUIDsIgnoresOtherSpecs(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "nvidia.com-gpu.yaml"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, _ := NewWriter(dir)
	uids, err := w.ClaimUIDs()
	if err != nil || len(uids) != 0 {
		t.Fatalf("%v %v", uids, err)
	}
}

// The driver's files reach a container once, however many of the claim's devices it names.
func TestCommonMountsAppliedOncePerContainer(t *testing.T) {
	dir := t.TempDir()
	lib := Mount{HostPath: "/run/nvidia/driver/usr/lib/libcuda.so.580.65.06", ContainerPath: "/usr/lib/libcuda.so.1", Options: []string{"ro", "nosuid", "nodev", "rbind", "rprivate"}}
	w, err := NewWriter(dir, lib)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := w.Write("uid-2", []Device{
		{Name: "gpu-0", DeviceNodes: []DeviceNode{{HostPath: "/dev/null", Path: "/dev/nvidia0"}}},
		{Name: "gpu-1", DeviceNodes: []DeviceNode{{HostPath: "/dev/zero", Path: "/dev/nvidia1"}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	for _, names := range [][]string{ids, ids[1:]} {
		ociSpec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
		if _, err := cache.InjectDevices(ociSpec, names...); err != nil {
			t.Fatal(err)
		}
		if len(ociSpec.Mounts) != 1 || ociSpec.Mounts[0].Source != lib.HostPath || ociSpec.Mounts[0].Destination != lib.ContainerPath || !slices.Equal(ociSpec.Mounts[0].Options, lib.Options) {
			t.Fatalf("devices %v: mounts %+v, want only %+v", names, ociSpec.Mounts, lib)
		}
	}
}
