package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// statusMemo remembers the last status message told about each claim, so that a claim
// looked at again and again is told once.
type statusMemo struct {
	mu   sync.Mutex
	last map[string]string
}

func newStatusMemo() *statusMemo { return &statusMemo{last: map[string]string{}} }

// Changed records msg as the claim's status and reports whether it differs from the last.
func (m *statusMemo) Changed(key, msg string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last[key] == msg {
		return false
	}
	m.last[key] = msg
	return true
}

// Forget drops a deleted claim.
func (m *statusMemo) Forget(key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.last, key)
}

// statusTeller tells people where a claim stands, each message once (memo).
type statusTeller struct {
	memo     *statusMemo
	client   kubernetes.Interface // the claim's status annotation
	recorder record.EventRecorder
	// fenced says why the allocator may not write now (nil: it may): nothing is said then.
	fenced func() error
}

// tell says where a claim stands: events on its pods and the status annotation on the
// claim, each only when the message changed. Nothing is repeated as an event on the claim:
// the annotation there says it, and under a burst every write counts (the API server is
// what limits placements per second). Nothing is said while the fence is closed.
func (st *statusTeller) tell(ctx context.Context, claim *resourceapi.ResourceClaim, pods []*corev1.Pod, msg, reason string) {
	if err := st.fenced(); err != nil {
		// Said by the leader, which looks at the claim again.
		klog.FromContext(ctx).V(3).Info("Not telling the claim's status", "err", err)
		return
	}
	if !st.memo.Changed(claimKey(claim), msg) {
		return
	}
	typ := corev1.EventTypeNormal
	if reason != ReasonPlaced {
		typ = corev1.EventTypeWarning
	}
	for _, p := range pods {
		st.recorder.Event(p, typ, reason, fmt.Sprintf("claim %s: %s", claim.Name, msg))
	}
	if claim.Annotations[api.AnnotationStatus] == msg {
		return
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{api.AnnotationStatus: msg}}})
	if err == nil {
		_, err = st.client.ResourceV1().ResourceClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		utilruntime.HandleErrorWithContext(ctx, err, "Patching the claim's status annotation", "claim", klog.KObj(claim))
	}
}
