// Package cdi writes one transient CDI spec per prepared claim. The spec carries the GPU's
// device nodes, the MPS pipe directory and caps as environment, the mounts, and the driver's
// files; containerd applies it to every container that names the claim.
package cdi

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// kind is the CDI kind of fgpu's devices: fgpu.dev/gpu.
const kind = api.CDIVendor + "/" + api.CDIClass

// DeviceNode is a host device node and where the container sees it.
type DeviceNode struct {
	HostPath, Path string
}

// Mount is a bind mount into the container.
type Mount struct {
	HostPath, ContainerPath string
	Options                 []string
}

// Device is one CDI device of a claim: one allocated GPU share.
type Device struct {
	// Name must be unique within the claim (e.g. the DRA device name).
	Name        string
	DeviceNodes []DeviceNode
	Env         []string
	Mounts      []Mount
}

// Writer writes and removes claim specs in one CDI directory.
type Writer struct {
	dir   string
	cache *cdiapi.Cache
	// common goes into every spec once, however many of its devices a container names.
	common []Mount
}

// NewWriter returns a writer for dir (e.g. /var/run/cdi), creating it if needed. Every spec
// it writes also carries common (the driver's files), applied once per container.
func NewWriter(dir string, common ...Mount) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create CDI directory: %w", err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", dir, err)
	}
	return &Writer{dir: dir, cache: cache, common: common}, nil
}

// specName is keyed by the claim UID, never reused, so a runtime's cached spec cannot be
// mistaken for a new claim's.
func specName(claimUID string) string {
	return cdiapi.GenerateTransientSpecName(api.CDIVendor, api.CDIClass, claimUID)
}

// DeviceID is the fully qualified CDI device ID of a claim's device.
func DeviceID(claimUID, device string) string {
	return fmt.Sprintf("%s=%s-%s", kind, claimUID, device)
}

// Write writes the claim's spec (replacing any earlier one) and returns its CDI device IDs.
func (w *Writer) Write(claimUID string, devices []Device) ([]string, error) {
	spec := &cdispec.Spec{Kind: kind}
	for _, m := range w.common {
		spec.ContainerEdits.Mounts = append(spec.ContainerEdits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: m.Options})
	}
	ids := make([]string, 0, len(devices))
	for _, d := range devices {
		edits := cdispec.ContainerEdits{Env: d.Env}
		for _, n := range d.DeviceNodes {
			edits.DeviceNodes = append(edits.DeviceNodes, &cdispec.DeviceNode{Path: n.Path, HostPath: n.HostPath})
		}
		for _, m := range d.Mounts {
			edits.Mounts = append(edits.Mounts, &cdispec.Mount{HostPath: m.HostPath, ContainerPath: m.ContainerPath, Options: m.Options})
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: claimUID + "-" + d.Name, ContainerEdits: edits})
		ids = append(ids, DeviceID(claimUID, d.Name))
	}
	version, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("CDI spec version for claim %s: %w", claimUID, err)
	}
	spec.Version = version
	if err := w.cache.WriteSpec(spec, specName(claimUID)); err != nil {
		return nil, fmt.Errorf("write CDI spec for claim %s: %w", claimUID, err)
	}
	return ids, nil
}

// Remove deletes the claim's spec; a missing spec is not an error.
func (w *Writer) Remove(claimUID string) error {
	if err := w.cache.RemoveSpec(specName(claimUID)); err != nil {
		return fmt.Errorf("remove CDI spec for claim %s: %w", claimUID, err)
	}
	return nil
}

// DeviceEnv is the environment the claim's spec on disk gives its device name: what the
// claim's running containers were given.
func (w *Writer) DeviceEnv(claimUID, name string) ([]string, error) {
	var errs []error
	for _, ext := range []string{".yaml", ".json"} {
		spec, err := cdiapi.ReadSpec(filepath.Join(w.dir, specName(claimUID)+ext), 0)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, d := range spec.Devices {
			if d.Name == claimUID+"-"+name {
				return d.ContainerEdits.Env, nil
			}
		}
		return nil, fmt.Errorf("CDI spec of claim %s has no device %s", claimUID, name)
	}
	return nil, fmt.Errorf("read the CDI spec of claim %s: %w", claimUID, errors.Join(errs...))
}

// ClaimUIDs lists the claims that have a spec on disk, so a restarted plugin can remove
// specs that no checkpoint entry accounts for.
func (w *Writer) ClaimUIDs() ([]string, error) {
	prefix := cdiapi.GenerateSpecName(api.CDIVendor, api.CDIClass) + "_"
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		return nil, err
	}
	var uids []string
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		ext := filepath.Ext(name)
		if ext != ".yaml" && ext != ".json" {
			continue
		}
		uids = append(uids, strings.TrimSuffix(strings.TrimPrefix(name, prefix), ext))
	}
	return uids, nil
}
