package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// ReasonCheckpointRecovered is the Node event's reason when a corrupt checkpoint was
// replaced by one rebuilt from the node and the API.
const ReasonCheckpointRecovered = "FgpuCheckpointRecovered"

// rebuild replaces a corrupt checkpoint. A claim is taken back only when both sides vouch
// for it: this node holds its CDI spec (the plugin prepared it) and the API still has it
// allocated here and reserved for a pod (someone still uses it). Its devices are planned
// again from its allocation, exactly as Prepare did, and checked against the capacity of
// the claims already taken back, so no share is counted twice and no GPU is over-committed.
// Everything else is left to recover, which removes the specs and daemons no entry owns;
// a reserved claim without a spec was never prepared here, and the kubelet prepares it.
// The refusals the checkpoint kept come back from the claims (refusals.recorded).
func (s *State) rebuild(ctx context.Context, client kubernetes.Interface, loadErr error) error {
	logger := klog.FromContext(ctx)
	if client == nil {
		return loadErr
	}
	list, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("%w; listing ResourceClaims to rebuild it: %w", loadErr, err)
	}
	aside, err := s.store.CopyAside(time.Now())
	if err != nil && aside == "" {
		return fmt.Errorf("%w; %w", loadErr, err)
	}
	if err != nil {
		logger.Error(err, "Removing old corrupt checkpoints")
	}
	specs, err := s.cdi.ClaimUIDs()
	if err != nil {
		return err
	}
	onNode := map[string]bool{}
	for _, uid := range specs {
		onNode[uid] = true
	}
	claims := list.Items
	// Oldest first, so that if the API's allocations over-commit a GPU the claims that ran
	// first keep it.
	sort.SliceStable(claims, func(i, j int) bool {
		a, b := claims[i].CreationTimestamp, claims[j].CreationTimestamp
		if !a.Equal(&b) {
			return a.Before(&b)
		}
		return claims[i].Namespace+"/"+claims[i].Name < claims[j].Namespace+"/"+claims[j].Name
	})
	s.cp = checkpoint.New()
	var kept, dropped, refusedAgain []string
	for i := range claims {
		claim := &claims[i]
		uid := string(claim.UID)
		if r := s.refusals.recorded(claim); len(r) > 0 {
			s.cp.Refused = append(s.cp.Refused, r...)
			refusedAgain = append(refusedAgain, claim.Namespace+"/"+claim.Name)
		}
		if !onNode[uid] || !s.planner.allocatedHere(claim) {
			continue
		}
		ref := claim.Namespace + "/" + claim.Name
		if len(claim.Status.ReservedFor) == 0 {
			dropped = append(dropped, ref+" (no longer reserved for a pod)")
			continue
		}
		planned, err := s.planner.plan(claim)
		if err == nil {
			s.daemonsOfSpec(ctx, uid, planned)
			err = s.room.checkCapacity(claim, planned)
		}
		if err != nil {
			logger.Error(err, "Not taking back a claim into the rebuilt checkpoint", "claim", klog.KObj(claim))
			dropped = append(dropped, fmt.Sprintf("%s (%v)", ref, err))
			continue
		}
		// The IDs the spec on the node already names, so that the checkpoint is complete
		// before anything is rewritten.
		for i := range planned {
			planned[i].CDIDeviceIDs = []string{cdi.DeviceID(uid, planned[i].Device)}
		}
		s.cp.Claims[uid] = &checkpoint.ClaimEntry{Namespace: claim.Namespace, Name: claim.Name, State: checkpoint.PrepareCompleted, Devices: planned}
		kept = append(kept, ref)
	}
	if n := len(s.cp.Refused) - maxRefusals; n > 0 {
		s.cp.Refused = slices.Delete(s.cp.Refused, 0, n)
	}
	// Saved before any side effect: a crash from here on restarts from this checkpoint,
	// never from an empty one that would remove every spec and daemon on the node.
	if err := s.save(); err != nil {
		return err
	}
	// The specs and daemons are written again only now that all entries are known: an MPS
	// server's default caps are the largest among its domain's tenants.
	for _, uid := range slices.Sorted(maps.Keys(s.cp.Claims)) {
		e := s.cp.Claims[uid]
		if err := s.apply(ctx, uid, e, false); err != nil {
			ref := e.Namespace + "/" + e.Name
			logger.Error(err, "Not taking back a claim into the rebuilt checkpoint", "claim", klog.KRef(e.Namespace, e.Name))
			if rbErr := s.rollback(ctx, uid, false); rbErr != nil {
				return fmt.Errorf("rebuild claim %s: %w; rolling it back: %w", ref, err, rbErr)
			}
			kept = slices.DeleteFunc(kept, func(k string) bool { return k == ref })
			dropped = append(dropped, fmt.Sprintf("%s (%v)", ref, err))
		}
	}
	orphans := len(specs) - len(kept)
	msg := fmt.Sprintf("kubelet plugin checkpoint was unreadable (%v) and was copied to %s; rebuilt from the CDI specs on the node and the ResourceClaims reserved here: took back %d claim(s) [%s]; %d CDI spec(s) no reserved claim owns are removed with their MPS servers",
		loadErr, aside, len(kept), strings.Join(kept, ", "), orphans)
	if len(dropped) > 0 {
		msg += fmt.Sprintf("; not taken back: %s", strings.Join(dropped, "; "))
	}
	if len(refusedAgain) > 0 {
		msg += fmt.Sprintf("; still refused (their refusal stands on the claim until the allocator places them again): %s", strings.Join(refusedAgain, ", "))
	}
	logger.Error(loadErr, "Rebuilt a corrupt checkpoint", "copiedTo", aside, "claims", kept, "dropped", dropped, "orphanSpecs", orphans, "refused", refusedAgain)
	if err := nodeEvent(ctx, client, s.cfg.NodeName, corev1.EventTypeWarning, ReasonCheckpointRecovered, msg); err != nil {
		// The log line above says the same; the plugin must not stay down for an event.
		logger.Error(err, "Recording the checkpoint recovery event")
	}
	return nil
}

// daemonsOfSpec gives each planned MPS device the daemon that the claim's spec on the node
// gave its containers: the planner derives a domain's key, but a domain whose first claim
// on the GPU took a spare daemon has the spare's.
func (s *State) daemonsOfSpec(ctx context.Context, uid string, planned []checkpoint.PreparedDevice) {
	for i := range planned {
		p := &planned[i]
		if p.MPSKey == "" {
			continue
		}
		env, err := s.cdi.DeviceEnv(uid, p.Device)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Rebuilding a claim's MPS daemon from its CDI spec; it joins its domain's daemon among the claims taken back", "claim", uid)
			s.sameDomainDaemons(planned[i : i+1])
			continue
		}
		for _, kv := range env {
			if pipe, ok := strings.CutPrefix(kv, configapi.EnvMPSPipeDirectory+"="); ok {
				if key := filepath.Base(filepath.Dir(pipe)); s.cdi.mps.PipeDir(key) == pipe {
					p.MPSKey = key
				}
			}
		}
	}
}

// maxEventMessage is the API server's limit on an event's message.
const maxEventMessage = 1024

// nodeEvent records an event on this node, named nodeName.
func nodeEvent(ctx context.Context, client kubernetes.Interface, nodeName, eventType, reason, msg string) error {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: nodeName + ".", Namespace: metav1.NamespaceDefault},
		// The kubelet names a Node's events by the node's name as its UID, too.
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: nodeName, UID: types.UID(nodeName)},
		Reason:         reason, Message: msg, Type: eventType,
		Source:         corev1.EventSource{Component: "fgpu-kubelet-plugin", Host: nodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	_, err := client.CoreV1().Events(metav1.NamespaceDefault).Create(ctx, ev, metav1.CreateOptions{})
	return err
}

// loadOrRebuild loads the checkpoint, rebuilding it when it is corrupt.
func (s *State) loadOrRebuild(ctx context.Context, client kubernetes.Interface) error {
	cp, err := s.store.Load()
	switch {
	case err == nil:
		s.cp = cp
	case !errors.Is(err, checkpoint.ErrCorrupt):
		return err
	default:
		if err := s.rebuild(ctx, client, err); err != nil {
			return err
		}
	}
	return s.modes.migrate(ctx)
}

// recover makes disk and processes match the checkpoint after a restart: half-prepared
// claims are rolled back (the kubelet retries them), specs and daemons that no entry
// accounts for are removed, and daemons that prepared claims need are running.
func (s *State) recover(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	for uid, e := range s.cp.Claims {
		if e.State != checkpoint.PrepareCompleted {
			logger.Info("Rolling back a claim whose prepare was interrupted", "claim", klog.KRef(e.Namespace, e.Name), "uid", uid)
			if err := s.rollback(ctx, uid, false); err != nil {
				return err
			}
		}
	}
	uids, err := s.cdi.ClaimUIDs()
	if err != nil {
		return err
	}
	for _, uid := range uids {
		if _, ok := s.cp.Claims[uid]; !ok {
			logger.Info("Removing a CDI spec no prepared claim accounts for", "uid", uid)
			if err := s.cdi.Remove(uid); err != nil {
				return err
			}
		}
	}
	// Every daemon present: also those that no entry accounts for.
	if err := s.daemons.stopStray(ctx); err != nil {
		return err
	}
	// The daemons prepared claims use are adopted as they run; only one that is gone (or
	// runs without answering) is started again, and its claims' pods moved: daemons.wasDown.
	checked := map[string]bool{}
	for uid, e := range s.cp.Claims {
		// Idempotent: a pod whose cgroup appeared while the plugin was down gets its caps now.
		s.caps.limitPods(ctx, e, e.Pods)
		for i := range e.Devices {
			p := &e.Devices[i]
			if p.MPSKey == "" || checked[p.MPSKey] {
				continue
			}
			checked[p.MPSKey] = true
			// One unanswered question is no dead daemon (a loaded node answers late): only a
			// daemon that had to be started anew lost its clients.
			started, err := s.daemons.ensure(ctx, p.MPSKey, p.GPUUUID, false)
			if started {
				s.daemons.wasDown(ctx, p, "")
				logger.Info("Started the MPS daemon of a prepared claim again", "claim", klog.KRef(e.Namespace, e.Name), "uid", uid, "daemon", p.MPSKey)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}
