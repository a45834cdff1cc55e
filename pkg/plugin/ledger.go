package plugin

import (
	"slices"
	"strings"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/mps"
)

// ledger is the checkpoint in memory and its file: the prepared claims every applier reads
// to decide what a GPU, a daemon or a pod needs. State's lock guards it; only State's
// transaction changes its claims, and the appliers read it (compute modes also record
// what they found) while that lock is held.
type ledger struct {
	store *checkpoint.Store
	cp    *checkpoint.Checkpoint
}

func (l *ledger) save() error { return l.store.Save(l.cp) }

// usedDaemons are the daemons of the checkpoint's claims.
func (l *ledger) usedDaemons() map[string]bool {
	used := map[string]bool{}
	for _, e := range l.cp.Claims {
		for _, p := range e.Devices {
			if p.MPSKey != "" {
				used[p.MPSKey] = true
			}
		}
	}
	return used
}

// sameDomainDaemons gives each planned MPS device the daemon its isolation domain already
// uses on its GPU, if any: a domain's key is the one its first claim there got (a spare's,
// or one an earlier version derived), not always the one the planner derives. A device whose
// domain has none there (any more) gets the derived key back.
func (l *ledger) sameDomainDaemons(planned []checkpoint.PreparedDevice) {
	for i := range planned {
		p := &planned[i]
		if p.MPSKey == "" {
			continue
		}
		ns, sub, _ := strings.Cut(p.IsolationDomain, "/")
		p.MPSKey = mps.Daemon{GPUUUID: p.GPUUUID, Namespace: ns, Domain: sub}.Key()
		for _, e := range l.cp.Claims {
			if j := slices.IndexFunc(e.Devices, func(q checkpoint.PreparedDevice) bool {
				return q.MPSKey != "" && q.GPUUUID == p.GPUUUID && q.IsolationDomain == p.IsolationDomain
			}); j >= 0 {
				p.MPSKey = e.Devices[j].MPSKey
				break
			}
		}
	}
}

// domainLimits are the MPS server defaults for a daemon: the largest caps among its
// tenants, so a client that drops its own limits still cannot take more than any tenant
// of its domain was given.
func (l *ledger) domainLimits(key string) mps.Limits {
	var lim mps.Limits
	for _, e := range l.cp.Claims {
		for _, p := range e.Devices {
			if p.MPSKey != key {
				continue
			}
			lim.PinnedMemBytes = max(lim.PinnedMemBytes, p.MemoryLimitBytes)
			thread := p.ThreadPercent
			if thread == 0 {
				thread = 100
			}
			lim.ThreadPercent = max(lim.ThreadPercent, thread)
		}
	}
	return lim
}

// mpsDaemon is what the checkpoint says of one daemon.
type mpsDaemon struct {
	gpu    string
	claims map[string]*checkpoint.ClaimEntry // by UID
}

// preparedDaemons are the daemons of prepared claims.
func (l *ledger) preparedDaemons() map[string]mpsDaemon {
	out := map[string]mpsDaemon{}
	for uid, e := range l.cp.Claims {
		if e.State != checkpoint.PrepareCompleted {
			continue
		}
		for _, p := range e.Devices {
			if p.MPSKey == "" {
				continue
			}
			d, ok := out[p.MPSKey]
			if !ok {
				d = mpsDaemon{gpu: p.GPUUUID, claims: map[string]*checkpoint.ClaimEntry{}}
				out[p.MPSKey] = d
			}
			d.claims[uid] = e
		}
	}
	return out
}

// daemonHeld says whether daemon key is to be guarded now (see daemonGuards.mark).
func (l *ledger) daemonHeld(key string) bool {
	for _, e := range l.cp.Claims {
		if slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return p.MPSKey == key }) &&
			(len(e.Pods) == 0 || slices.ContainsFunc(e.Pods, func(p checkpoint.PodRef) bool { return !p.DaemonSet })) {
			return true
		}
	}
	return false
}

// claimedOn says whether a claim other than except is prepared (or being prepared) on GPU uuid.
func (l *ledger) claimedOn(uuid, except string) bool {
	for uid, e := range l.cp.Claims {
		if uid != except && slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return p.GPUUUID == uuid }) {
			return true
		}
	}
	return false
}

func hasPod(e *checkpoint.ClaimEntry, uid string) bool {
	return slices.ContainsFunc(e.Pods, func(p checkpoint.PodRef) bool { return p.UID == uid })
}
