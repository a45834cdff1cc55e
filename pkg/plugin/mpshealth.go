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

// check asks fgpu's MPS daemons of prepared claims whether they serve them, restarts a
// daemon that failed mpsDeadChecks checks in a row, and returns the daemons whose clients
// lost their server: a server in FAULT (after a client's fatal fault it refuses new clients
// until all of its clients exited), or a daemon that died under prepared claims (found at
// the plugin's start, or here); the latter until those claims are unprepared. The daemons
// are asked, stopped and restarted without State's lock, so prepares and unprepares do not wait for
// them (those of the same domain wait for its restart), and concurrently, each within its own
// command timeout: a tenant controls its daemon's control socket, and a domain that does not
// answer delays no other domain's check. A cancelled check says nothing.
func (d *daemons) check(ctx context.Context) []MPSFault {
	d.mu.Lock()
	d.retryStops(ctx, true)
	keys := slices.Sorted(maps.Keys(d.l.preparedDaemons()))
	d.guards.unlock(ctx) // with the guards left by the plugin's start (recover)
	answered, faulted := make([]bool, len(keys)), make([][]int, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			pids, err := d.mps.FaultedServers(ctx, key)
			answered[i], faulted[i] = err == nil, pids
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return nil
	}

	logger := klog.FromContext(ctx)
	d.mu.Lock()
	defer d.mu.Unlock()
	prepared := d.l.preparedDaemons()
	for key := range d.unanswered {
		if _, ok := prepared[key]; !ok {
			delete(d.unanswered, key)
		}
	}
	faultedOf := map[string][]int{}
	var restart []string
	for i, key := range keys {
		faultedOf[key] = faulted[i]
		if _, ok := prepared[key]; !ok || answered[i] {
			delete(d.unanswered, key)
			continue
		}
		d.unanswered[key]++
		if d.unanswered[key] < mpsDeadChecks {
			continue
		}
		delete(d.unanswered, key)
		restart = append(restart, key)
	}
	// Concurrently, so that one domain's slow restart delays no other's; ensure
	// releases State's lock meanwhile.
	d.mu.Unlock()
	for _, key := range restart {
		daemon := prepared[key]
		wg.Go(func() {
			d.mu.Lock()
			defer d.guards.unlock(ctx)
			// A prepare may have restarted it since it was asked, and a daemon that answers
			// once adopted never died.
			started, err := d.ensure(ctx, key, daemon.gpu, true)
			if started {
				logger.Info("Restarted an MPS daemon that stopped answering; its clients lost their server and are moved", "daemon", key, "gpu", daemon.gpu, "claims", len(daemon.claims))
				for uid := range daemon.claims {
					d.diedFor(key, uid)
				}
			}
			if err != nil {
				logger.Error(err, "Restarting an MPS daemon; the next check tries again", "daemon", key)
			}
		})
	}
	wg.Wait()
	d.mu.Lock()
	prepared = d.l.preparedDaemons()
	var out []MPSFault
	for _, key := range slices.Sorted(maps.Keys(prepared)) {
		daemon := prepared[key]
		var msg string
		if died := d.diedUnder[key]; died != nil {
			maps.DeleteFunc(died, func(uid string, _ bool) bool { return daemon.claims[uid] == nil })
			if len(died) > 0 {
				msg = fmt.Sprintf("the MPS control daemon of its isolation domain on GPU %s died; it was restarted, but this pod's processes lost their server", daemon.gpu)
			}
		}
		if msg == "" && len(faultedOf[key]) > 0 {
			msg = fmt.Sprintf("the MPS server of its isolation domain on GPU %s is in FAULT after a client's fatal error: it refuses new clients until all of its clients exited", daemon.gpu)
		}
		if msg == "" {
			continue
		}
		f := MPSFault{Key: key, GPUUUID: daemon.gpu, Message: msg}
		for _, uid := range slices.Sorted(maps.Keys(daemon.claims)) {
			if died := d.diedUnder[key]; died != nil && !died[uid] && len(faultedOf[key]) == 0 {
				continue // prepared on the restarted daemon: it has a server
			}
			e := daemon.claims[uid]
			f.Claims = append(f.Claims, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: e.Namespace, Name: e.Name}, UID: types.UID(uid)})
		}
		out = append(out, f)
	}
	for key := range d.diedUnder {
		if _, ok := prepared[key]; !ok || len(d.diedUnder[key]) == 0 {
			delete(d.diedUnder, key)
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
