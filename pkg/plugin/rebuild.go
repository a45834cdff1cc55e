package plugin

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/cdi"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
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
// The refusals the checkpoint kept come back from the claims (recordedRefusals).
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
		if r := s.recordedRefusals(claim); len(r) > 0 {
			s.cp.Refused = append(s.cp.Refused, r...)
			refusedAgain = append(refusedAgain, claim.Namespace+"/"+claim.Name)
		}
		if !onNode[uid] || !s.allocatedHere(claim) {
			continue
		}
		ref := claim.Namespace + "/" + claim.Name
		if len(claim.Status.ReservedFor) == 0 {
			dropped = append(dropped, ref+" (no longer reserved for a pod)")
			continue
		}
		planned, err := s.plan(claim)
		if err == nil {
			err = s.checkCapacity(claim, planned)
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
	if err := s.store.Save(s.cp); err != nil {
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
	if err := s.nodeEvent(ctx, client, corev1.EventTypeWarning, ReasonCheckpointRecovered, msg); err != nil {
		// The log line above says the same; the plugin must not stay down for an event.
		logger.Error(err, "Recording the checkpoint recovery event")
	}
	return nil
}

// recordedRefusals are the refusals the checkpoint lost of a claim the allocator places again
// (placedAgain): the Prepared=False conditions this node's plugin recorded on the claim's
// status.devices (publishRefusal), for shares of its current allocation. Until the allocator
// acts on them they must stay refused, as rememberRefusal kept them: the allocator takes
// the allocation back when it reads the condition, also from a running pod.
func (s *State) recordedRefusals(claim *resourceapi.ResourceClaim) []checkpoint.Refusal {
	if !s.placedAgain(claim) {
		return nil
	}
	var out []checkpoint.Refusal
	for _, d := range claim.Status.Devices {
		if d.Driver != s.cfg.DriverName || d.Pool != s.cfg.NodeName {
			continue
		}
		c := meta.FindStatusCondition(d.Conditions, configapi.DeviceConditionPrepared)
		if c == nil || c.Status != metav1.ConditionFalse || !slices.Contains(refusalReasons, c.Reason) {
			continue
		}
		r := checkpoint.Refusal{ClaimUID: string(claim.UID), Pool: d.Pool, Device: d.Device, ShareID: ptr.Deref(d.ShareID, ""), Reason: c.Reason, Message: c.Message}
		if s.allocates(claim, r) {
			out = append(out, r)
		}
	}
	return out
}

// refusalReasons are the reasons of the refusals the allocator acts on.
var refusalReasons = []string{configapi.PrepareReasonOverCommitted, configapi.PrepareReasonDeviceGone, configapi.PrepareReasonIsolationConflict}

// allocatedHere says whether a claim holds a device of this driver from this node's pool.
func (s *State) allocatedHere(claim *resourceapi.ResourceClaim) bool {
	if claim.Status.Allocation == nil {
		return false
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver == s.cfg.DriverName && r.Pool == s.cfg.NodeName {
			return true
		}
	}
	return false
}

// maxEventMessage is the API server's limit on an event's message.
const maxEventMessage = 1024

func (s *State) nodeEvent(ctx context.Context, client kubernetes.Interface, eventType, reason, msg string) error {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: s.cfg.NodeName + ".", Namespace: metav1.NamespaceDefault},
		// The kubelet names a Node's events by the node's name as its UID, too.
		InvolvedObject: corev1.ObjectReference{Kind: "Node", Name: s.cfg.NodeName, UID: types.UID(s.cfg.NodeName)},
		Reason:         reason, Message: msg, Type: eventType,
		Source:         corev1.EventSource{Component: "fgpu-kubelet-plugin", Host: s.cfg.NodeName},
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
	return s.migrateComputeModes(ctx)
}

// migrateComputeModes completes FoundComputeModes where the checkpoint does not vouch for it
// (an earlier version's, or one rebuilt after corruption): such a plugin may have put a GPU
// holding MPS claims in EXCLUSIVE_PROCESS without recording it, and would have set it back
// to Default when its last claim went. So Default is recorded as found there, and the mode
// goes back to Default then instead of staying EXCLUSIVE_PROCESS for good.
func (s *State) migrateComputeModes(ctx context.Context) error {
	if s.cp.ComputeModesRecorded {
		return nil
	}
	s.cp.ComputeModesRecorded = true
	var gpus []string
	for _, e := range s.cp.Claims {
		for _, p := range e.Devices {
			if _, ok := s.cp.FoundComputeModes[p.GPUUUID]; p.MPSKey == "" || ok || slices.Contains(gpus, p.GPUUUID) {
				continue
			}
			gpus = append(gpus, p.GPUUUID)
		}
	}
	if len(gpus) == 0 {
		return nil
	}
	if s.cp.FoundComputeModes == nil {
		s.cp.FoundComputeModes = map[string]string{}
	}
	for _, uuid := range gpus {
		s.cp.FoundComputeModes[uuid] = string(gpu.ComputeModeDefault)
	}
	if err := s.store.Save(s.cp); err != nil {
		return fmt.Errorf("record the compute modes of GPUs with MPS claims: %w", err)
	}
	klog.FromContext(ctx).Info("The checkpoint did not record the compute modes fgpu changed; GPUs holding MPS claims go back to Default when their last claim goes", "gpus", gpus)
	return nil
}
