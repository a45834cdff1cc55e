// Package checkpoint persists what the kubelet plugin has prepared, in two phases, so that a
// plugin killed at any line can tell on restart what to finish or undo.
package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"sort"
	"time"
)

// ErrCorrupt marks a checkpoint file that exists but cannot be trusted: it does not decode,
// fails its checksum, has another format version, or does not validate.
var ErrCorrupt = errors.New("checkpoint is corrupt")

// KeepCorrupt is how many corrupt checkpoints CopyAside keeps for a post-mortem.
const KeepCorrupt = 3

// Version identifies the checkpoint format; bump it on incompatible changes.
const Version = "fgpu.dev/checkpoint/v1"

// ClaimState is the phase a claim's preparation reached.
type ClaimState string

const (
	// PrepareStarted is written before any side effect (MPS daemon, CDI spec): on restart an
	// entry still in this state is rolled back, and the kubelet's retry prepares it afresh.
	PrepareStarted ClaimState = "PrepareStarted"
	// PrepareCompleted is written after every side effect succeeded.
	PrepareCompleted ClaimState = "PrepareCompleted"
)

// Checkpoint is the plugin's durable state: every claim it prepared or began to prepare.
type Checkpoint struct {
	Version string                 `json:"version"`
	Claims  map[string]*ClaimEntry `json:"claims"`
	// Refused are allocations the plugin refused to prepare for a reason the allocator acts
	// on, oldest first. The plugin refuses each again on every retry, so that the claim's
	// refusal condition, which the allocator may read late, never stands next to a prepared
	// share; earlier versions ignore the field.
	Refused []Refusal `json:"refused,omitempty"`
	// FoundComputeModes are the compute modes of the GPUs (by UUID) whose mode the plugin
	// changed, as it found them: it puts each back when its last claim there goes, and never
	// touches a GPU it has not changed. Earlier versions ignore the field.
	FoundComputeModes map[string]string `json:"foundComputeModes,omitempty"`
	// ComputeModesRecorded says that FoundComputeModes is complete: every mode the plugin
	// changed is in it. A checkpoint of an earlier version, or one rebuilt after corruption,
	// lacks it, and the plugin then records the modes it may have changed (see the plugin's
	// computeModes.migrate).
	ComputeModesRecorded bool `json:"computeModesRecorded,omitempty"`
}

// Refusal is one refused allocation result: a claim's device and share, and why.
type Refusal struct {
	ClaimUID string `json:"claimUID"`
	Pool     string `json:"pool"`
	Device   string `json:"device"`
	ShareID  string `json:"shareID,omitempty"`
	Reason   string `json:"reason"`
	Message  string `json:"message"`
}

// ClaimEntry is one prepared claim, keyed by its UID in Checkpoint.Claims.
type ClaimEntry struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	State     ClaimState       `json:"state"`
	Devices   []PreparedDevice `json:"devices"`
	// Pods are the pods of this node the claim is reserved for, each checked against the API
	// (at prepare, or when a pod joins the prepared claim): where the GPU's memory is
	// partitioned by the dmem cgroup controller, their cgroups get the claim's GPU memory cap.
	Pods []PodRef `json:"pods,omitempty"`
}

// PodRef names a pod by the UID the API server gave it (which alone picks its cgroup).
type PodRef struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
	// DaemonSet says a DaemonSet controls the pod, as last seen: a drain leaves such a pod on
	// the node, so it does not keep its MPS daemon from being evicted.
	DaemonSet bool `json:"daemonSet,omitempty"`
}

// PreparedDevice is one allocated GPU share of a claim.
type PreparedDevice struct {
	Request        string `json:"request"`
	Pool           string `json:"pool"`
	Device         string `json:"device"`
	GPUUUID        string `json:"gpuUUID"`
	ShareID        string `json:"shareID,omitempty"`
	MemoryBytes    int64  `json:"memoryBytes"`
	ComputePercent int64  `json:"computePercent"`
	// MemoryLimitBytes and ThreadPercent are the caps enforced: at most the allocation, but
	// for a burst share's memory (the allocator's placement.memoryLimit), above MemoryBytes.
	MemoryLimitBytes int64  `json:"memoryLimitBytes"`
	ThreadPercent    int64  `json:"threadPercent"`
	Mode             string `json:"mode"`
	// IsolationDomain is "<namespace>/<sub-domain>" (entries of earlier versions: the
	// domain string their allocation named).
	IsolationDomain string `json:"isolationDomain"`
	MPSKey          string `json:"mpsKey,omitempty"`
	// MemoryEnforced says whether nothing in the claim's containers can pin more than
	// MemoryLimitBytes; MemoryEnforcement says why, in words.
	MemoryEnforced    bool   `json:"memoryEnforced,omitempty"`
	MemoryEnforcement string `json:"memoryEnforcement,omitempty"`
	// MemoryCap is what caps the share's GPU memory: cgroup (the pod's processes together,
	// dmem.max, and each MPS client process too), mps-per-process, none (time-slicing) or
	// whole-gpu.
	MemoryCap    string   `json:"memoryCap,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// New returns an empty checkpoint.
func New() *Checkpoint { return &Checkpoint{Version: Version, Claims: map[string]*ClaimEntry{}} }

// Validate checks a decoded checkpoint before the plugin trusts it.
func (c *Checkpoint) Validate() error {
	if c.Version != Version {
		return fmt.Errorf("checkpoint version %q is not %q", c.Version, Version)
	}
	for uid, e := range c.Claims {
		if e == nil {
			return fmt.Errorf("checkpoint claim %s: empty entry", uid)
		}
		if e.State != PrepareStarted && e.State != PrepareCompleted {
			return fmt.Errorf("checkpoint claim %s: unknown state %q", uid, e.State)
		}
		for _, d := range e.Devices {
			if d.GPUUUID == "" || d.Device == "" || d.MemoryBytes < 0 || d.ComputePercent < 0 || d.ComputePercent > 100 {
				return fmt.Errorf("checkpoint claim %s: invalid device %+v", uid, d)
			}
		}
	}
	for _, r := range c.Refused {
		if r.ClaimUID == "" || r.Device == "" || r.Reason == "" {
			return fmt.Errorf("checkpoint: invalid refusal %+v", r)
		}
	}
	return nil
}

// file is the on-disk envelope: the checksum catches a torn or hand-edited file.
type file struct {
	Checksum uint32          `json:"checksum"`
	Data     json.RawMessage `json:"data"`
}

// Store reads and writes one checkpoint file atomically.
type Store struct{ path string }

// NewStore returns a store for the checkpoint at path.
func NewStore(path string) *Store { return &Store{path: path} }

// Load reads the checkpoint; a missing file is an empty checkpoint.
func (s *Store) Load() (*Checkpoint, error) {
	raw, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return New(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoint: %w", err)
	}
	var f file
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%w: decode %s: %w", ErrCorrupt, s.path, err)
	}
	if sum := crc32.ChecksumIEEE(f.Data); sum != f.Checksum {
		return nil, fmt.Errorf("%w: %s has checksum %08x, want %08x", ErrCorrupt, s.path, sum, f.Checksum)
	}
	cp := New()
	if err := json.Unmarshal(f.Data, cp); err != nil {
		return nil, fmt.Errorf("%w: decode %s: %w", ErrCorrupt, s.path, err)
	}
	if cp.Claims == nil {
		cp.Claims = map[string]*ClaimEntry{}
	}
	if err := cp.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrCorrupt, s.path, err)
	}
	return cp, nil
}

// CopyAside copies the checkpoint to <path>.corrupt-<UTC time> for a post-mortem, and
// deletes all but the newest KeepCorrupt such copies so that a checkpoint that keeps
// breaking cannot fill the disk. It copies rather than renames: the file stays in place
// until Save replaces it, so a crash in between finds it corrupt again, never missing
// (which would read as a node with nothing prepared). It returns the copy's path.
func (s *Store) CopyAside(now time.Time) (string, error) {
	raw, err := os.ReadFile(s.path)
	if err != nil {
		return "", fmt.Errorf("copy corrupt checkpoint aside: %w", err)
	}
	aside := s.path + ".corrupt-" + now.UTC().Format("20060102T150405.000000000Z")
	if err := writeSynced(aside, raw); err != nil {
		return "", fmt.Errorf("copy corrupt checkpoint aside: %w", err)
	}
	old, err := filepath.Glob(s.path + ".corrupt-*")
	if err != nil {
		return aside, err
	}
	// The timestamp format sorts as text.
	sort.Sort(sort.Reverse(sort.StringSlice(old)))
	var errs []error
	for _, p := range old[min(len(old), KeepCorrupt):] {
		errs = append(errs, os.Remove(p))
	}
	return aside, errors.Join(errs...)
}

// Save writes the checkpoint with write-fsync-rename so a crash leaves the old or the new
// file, never a torn one.
func (s *Store) Save(cp *Checkpoint) error {
	data, err := json.Marshal(cp)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(file{Checksum: crc32.ChecksumIEEE(data), Data: data})
	if err != nil {
		return err
	}
	dir := filepath.Dir(s.path)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return fmt.Errorf("create checkpoint directory: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".checkpoint-*")
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync checkpoint: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("replace checkpoint: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func writeSynced(path string, raw []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(raw); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
