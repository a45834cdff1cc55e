package plugin

import (
	"context"
	"fmt"
	"slices"

	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
)

// computeModes is the compute-mode applier: it sets each GPU's mode from the prepared claims
// and gives back the mode it found. What it found lives in the checkpoint (it must survive a
// crash between the change and the next save), so it has no state or lock of its own: it
// runs under State's lock.
type computeModes struct {
	backend gpu.Backend
	l       *ledger
	// foreign says which GPUs run processes fgpu did not start: their mode is left alone.
	foreign interface{ busy(uuid string) []int }
}

// sync puts a GPU in EXCLUSIVE_PROCESS while exactly one MPS server (one
// isolation domain) and nothing else uses it, so nothing but that server can open it.
// Servers of several domains on one GPU need the default mode: they time-slice the GPU
// between them; so do time-sliced claims, whose processes are not MPS clients (in scheduler
// mode kube-scheduler may put one next to an MPS share). checkIsolation keeps both off a GPU
// whose MPS share was told its memory is enforced.
//
// fgpu changes only what it needs and gives back what it found: the first change records
// the GPU's mode in the checkpoint, and when fgpu's last claim on the GPU goes that mode is
// restored. A GPU fgpu has not changed is not touched (an admin's mode stays), nor is one
// that holds only whole-GPU claims, nor one that runs processes fgpu did not start: changing its mode could lock them or fgpu's MPS
// server out.
func (m *computeModes) sync(ctx context.Context, uuid string) error {
	used, domains, timeSliced := false, map[string]bool{}, false
	for _, e := range m.l.cp.Claims {
		for _, p := range e.Devices {
			if p.GPUUUID != uuid {
				continue
			}
			used = true
			switch {
			case p.MPSKey != "":
				domains[p.MPSKey] = true
			case p.Mode == string(configapi.SharingModeTimeSlicing):
				timeSliced = true
			}
		}
	}
	found, changed := m.l.cp.FoundComputeModes[uuid]
	if !used && !changed {
		return nil
	}
	if used && len(domains) == 0 && !timeSliced {
		// Whole-GPU claims only: fgpu wants no mode there, and the tenant may rely on the one it has.
		return nil
	}
	if pids := m.foreign.busy(uuid); len(pids) > 0 {
		klog.FromContext(ctx).V(2).Info("Leaving the compute mode of a GPU that runs processes fgpu did not start", "gpu", uuid, "pids", pids)
		return nil
	}
	want := gpu.ComputeMode(found)
	if used {
		want = gpu.ComputeModeDefault
		if len(domains) == 1 && !timeSliced {
			want = gpu.ComputeModeExclusiveProcess
		}
	}
	current, err := m.current(uuid)
	if err != nil {
		return err
	}
	if current != want {
		if !changed {
			if m.l.cp.FoundComputeModes == nil {
				m.l.cp.FoundComputeModes = map[string]string{}
			}
			// Saved before the change, so that a crash right after it still restores the mode.
			m.l.cp.FoundComputeModes[uuid] = string(current)
			if err := m.l.save(); err != nil {
				delete(m.l.cp.FoundComputeModes, uuid)
				return err
			}
		}
		if err := m.backend.SetComputeMode(uuid, want); err != nil {
			return fmt.Errorf("set compute mode of GPU %s to %s: %w", uuid, want, err)
		}
	}
	if !used {
		delete(m.l.cp.FoundComputeModes, uuid)
		if err := m.l.save(); err != nil {
			// The mode is back; a later sync finds it so and forgets it then.
			klog.FromContext(ctx).Error(err, "Forgetting a restored compute mode", "gpu", uuid)
		}
	}
	return nil
}

func (m *computeModes) current(uuid string) (gpu.ComputeMode, error) {
	devs, err := m.backend.Devices()
	if err != nil {
		return "", fmt.Errorf("read compute mode of GPU %s: %w", uuid, err)
	}
	for _, d := range devs {
		if d.UUID == uuid {
			return d.ComputeMode, nil
		}
	}
	return "", fmt.Errorf("GPU %s is gone", uuid)
}

// migrate completes FoundComputeModes where the checkpoint does not vouch for it
// (an earlier version's, or one rebuilt after corruption): such a plugin may have put a GPU
// holding MPS claims in EXCLUSIVE_PROCESS without recording it, and would have set it back
// to Default when its last claim went. So Default is recorded as found there, and the mode
// goes back to Default then instead of staying EXCLUSIVE_PROCESS for good.
func (m *computeModes) migrate(ctx context.Context) error {
	cp := m.l.cp
	if cp.ComputeModesRecorded {
		return nil
	}
	cp.ComputeModesRecorded = true
	var gpus []string
	for _, e := range cp.Claims {
		for _, p := range e.Devices {
			if _, ok := cp.FoundComputeModes[p.GPUUUID]; p.MPSKey == "" || ok || slices.Contains(gpus, p.GPUUUID) {
				continue
			}
			gpus = append(gpus, p.GPUUUID)
		}
	}
	if len(gpus) == 0 {
		return nil
	}
	if cp.FoundComputeModes == nil {
		cp.FoundComputeModes = map[string]string{}
	}
	for _, uuid := range gpus {
		cp.FoundComputeModes[uuid] = string(gpu.ComputeModeDefault)
	}
	if err := m.l.save(); err != nil {
		return fmt.Errorf("record the compute modes of GPUs with MPS claims: %w", err)
	}
	klog.FromContext(ctx).Info("The checkpoint did not record the compute modes fgpu changed; GPUs holding MPS claims go back to Default when their last claim goes", "gpus", gpus)
	return nil
}
