package plugin

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
)

// An MPS daemon serves one isolation domain (one namespace's sub-domain), and a tenant can
// break its own (its pipe directory is mounted read-write into its containers). So a daemon
// that cannot serve its clients is never the GPU's fault: no device taint, no flapping
// count. The plugin restarts a dead daemon and moves the clients of a broken one: it evicts
// the pods of that daemon's claims, and only those (docs/faults.md).

// mpsDeadChecks is how many checks in a row a daemon must fail to be taken for dead: one
// slow answer or failed fork is not a dead daemon.
const mpsDeadChecks = 3

// ReasonMPSServerLost is the pod event of a pod evicted because its MPS server broke.
const ReasonMPSServerLost = "FgpuMPSServerLost"

// MPSFault is one daemon whose clients lost their server.
type MPSFault struct {
	Key, GPUUUID string
	// Claims are the daemon's prepared claims: their pods are moved.
	Claims []kubeletplugin.NamespacedObject
	// Message says why, for the pods' events.
	Message string
}

// mpsDaemon is what the checkpoint says of one daemon.
type mpsDaemon struct {
	gpu    string
	claims map[string]*checkpoint.ClaimEntry // by UID
}

// mpsDaemons are the daemons of prepared claims. Caller holds s.mu.
func (s *State) mpsDaemons() map[string]mpsDaemon {
	out := map[string]mpsDaemon{}
	for uid, e := range s.cp.Claims {
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

// CheckMPS asks fgpu's MPS daemons of prepared claims whether they serve them, restarts a
// daemon that failed mpsDeadChecks checks in a row, and returns the daemons whose clients
// lost their server: a server in FAULT (after a client's fatal fault it refuses new clients
// until all of its clients exited), or a daemon that died under prepared claims (found at
// the plugin's start, or here); the latter until those claims are unprepared. The daemons
// are asked, stopped and restarted without s.mu, so prepares and unprepares do not wait for
// them (those of the same domain wait for its restart), and concurrently, each within its own
// command timeout: a tenant controls its daemon's control socket, and a domain that does not
// answer delays no other domain's check. A cancelled check says nothing.
func (s *State) CheckMPS(ctx context.Context) []MPSFault {
	s.mu.Lock()
	s.retryStops(ctx, true)
	keys := slices.Sorted(maps.Keys(s.mpsDaemons()))
	s.unlock(ctx) // with the guards left by the plugin's start (recover)
	answered, faulted := make([]bool, len(keys)), make([][]int, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			pids, err := s.mps.FaultedServers(ctx, key)
			answered[i], faulted[i] = err == nil, pids
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}

	logger := klog.FromContext(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	daemons := s.mpsDaemons()
	for key := range s.unanswered {
		if _, ok := daemons[key]; !ok {
			delete(s.unanswered, key)
		}
	}
	faultedOf := map[string][]int{}
	var restart []string
	for i, key := range keys {
		faultedOf[key] = faulted[i]
		if _, ok := daemons[key]; !ok || answered[i] {
			delete(s.unanswered, key)
			continue
		}
		s.unanswered[key]++
		if s.unanswered[key] < mpsDeadChecks {
			continue
		}
		delete(s.unanswered, key)
		restart = append(restart, key)
	}
	// Concurrently, so that one domain's slow restart delays no other's; ensureDaemon
	// releases s.mu meanwhile.
	s.mu.Unlock()
	for _, key := range restart {
		d := daemons[key]
		wg.Go(func() {
			s.mu.Lock()
			defer s.unlock(ctx)
			// A prepare may have restarted it since it was asked, and a daemon that answers
			// once adopted never died.
			started, err := s.ensureDaemon(ctx, key, d.gpu, true)
			if started {
				logger.Info("Restarted an MPS daemon that stopped answering; its clients lost their server and are moved", "daemon", key, "gpu", d.gpu, "claims", len(d.claims))
				if s.diedUnder[key] == nil {
					s.diedUnder[key] = map[string]bool{}
				}
				for uid := range d.claims {
					s.diedUnder[key][uid] = true
				}
			}
			if err != nil {
				logger.Error(err, "Restarting an MPS daemon; the next check tries again", "daemon", key)
			}
		})
	}
	wg.Wait()
	s.mu.Lock()
	daemons = s.mpsDaemons()
	var out []MPSFault
	for _, key := range slices.Sorted(maps.Keys(daemons)) {
		d := daemons[key]
		var msg string
		if died := s.diedUnder[key]; died != nil {
			maps.DeleteFunc(died, func(uid string, _ bool) bool { return d.claims[uid] == nil })
			if len(died) > 0 {
				msg = fmt.Sprintf("the MPS control daemon of its isolation domain on GPU %s died; it was restarted, but this pod's processes lost their server", d.gpu)
			}
		}
		if msg == "" && len(faultedOf[key]) > 0 {
			msg = fmt.Sprintf("the MPS server of its isolation domain on GPU %s is in FAULT after a client's fatal error: it refuses new clients until all of its clients exited", d.gpu)
		}
		if msg == "" {
			continue
		}
		f := MPSFault{Key: key, GPUUUID: d.gpu, Message: msg}
		for _, uid := range slices.Sorted(maps.Keys(d.claims)) {
			if died := s.diedUnder[key]; died != nil && !died[uid] && len(faultedOf[key]) == 0 {
				continue // prepared on the restarted daemon: it has a server
			}
			e := d.claims[uid]
			f.Claims = append(f.Claims, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: e.Namespace, Name: e.Name}, UID: types.UID(uid)})
		}
		out = append(out, f)
	}
	for key := range s.diedUnder {
		if _, ok := daemons[key]; !ok || len(s.diedUnder[key]) == 0 {
			delete(s.diedUnder, key)
		}
	}
	return out
}

// moveMPSClients evicts the pods of the claims whose MPS server broke, through the Eviction
// API (disruption budgets apply; a refused eviction is tried again at the next poll), with
// an event on each pod saying why, once. Their controllers recreate them.
func (d *Driver) moveMPSClients(ctx context.Context, faults []MPSFault) {
	logger := klog.FromContext(ctx)
	told := map[types.UID]bool{}
	for _, f := range faults {
		for _, c := range f.Claims {
			for _, pod := range d.podsOfClaim(ctx, c) {
				told[pod.UID] = true
				if !d.evicting[pod.UID] {
					logger.Info("Evicting a pod whose MPS server broke", "pod", klog.KObj(pod), "claim", klog.KRef(c.Namespace, c.Name), "daemon", f.Key)
					d.podEvent(ctx, pod.Namespace, checkpoint.PodRef{UID: string(pod.UID), Name: pod.Name}, ReasonMPSServerLost,
						fmt.Sprintf("Evicted: %s (claim %s); the pod is moved, other isolation domains on the GPU are not touched", f.Message, c.Name))
				}
				uid := pod.UID
				err := d.client.PolicyV1().Evictions(pod.Namespace).Evict(ctx, &policyv1.Eviction{
					ObjectMeta:    metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace},
					DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}},
				})
				if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					logger.Error(err, "Evicting a pod whose MPS server broke; trying again at the next check", "pod", klog.KObj(pod))
				}
			}
		}
	}
	d.evicting = told
}

// podsOfClaim are the running pods of this node that reserved the claim.
func (d *Driver) podsOfClaim(ctx context.Context, c kubeletplugin.NamespacedObject) []*corev1.Pod {
	claim, err := d.client.ResourceV1().ResourceClaims(c.Namespace).Get(ctx, c.Name, metav1.GetOptions{})
	if err != nil || claim.UID != c.UID {
		if err != nil && !apierrors.IsNotFound(err) {
			klog.FromContext(ctx).Error(err, "Looking up a claim whose MPS server broke", "claim", klog.KRef(c.Namespace, c.Name))
		}
		return nil
	}
	var out []*corev1.Pod
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.client.CoreV1().Pods(c.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			if !apierrors.IsNotFound(err) {
				klog.FromContext(ctx).Error(err, "Looking up a pod whose MPS server broke", "pod", klog.KRef(c.Namespace, ref.Name))
			}
			continue
		}
		if pod.UID != ref.UID || pod.Spec.NodeName != d.cfg.NodeName || pod.DeletionTimestamp != nil {
			continue
		}
		out = append(out, pod)
	}
	return out
}
