package controller

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// When capacity frees up (the pods a fault evicted came back, a tenant left), the
// critical claim gets it, though a standard one waited longer.
func TestDisplacedClaimsPlacedCriticalFirst(t *testing.T) {
	pols := []*api.SharingPolicy{
		builders.MakePolicy("crit").Latency(api.LatencyCritical).Namespaces("kubernetes.io/metadata.name", "a").Pods("tier", "critical").Priority(10).Obj(),
	}
	e := newEnv(t, pols, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"), namespaceObj("a"),
		builders.MakeClaim("a", "old").Memory("60Gi").Obj(), builders.MakePod("a", "old").Claim("old").Obj())
	e.run()
	if e.placedOn("a", "old") != "n1/gpu-0" {
		t.Fatal("not placed")
	}
	e.create(builders.MakeClaim("a", "std").Memory("50Gi").Created(1).Obj(), builders.MakePod("a", "std").Claim("std").Obj(),
		builders.MakeClaim("a", "crit").Memory("50Gi").Created(2).Obj(), builders.MakePod("a", "crit").Claim("crit").Label("tier", "critical").Obj())
	e.run()
	if e.placedOn("a", "std") != "" || e.placedOn("a", "crit") != "" {
		t.Fatal("placed on a GPU with 20Gi free")
	}
	_ = e.client.CoreV1().Pods("a").Delete(e.ctx, "old", metav1.DeleteOptions{})
	_ = e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, "old", metav1.DeleteOptions{})
	e.run()
	if got := e.placedOn("a", "crit"); got != "n1/gpu-0" {
		t.Errorf("the critical claim is on %q; the older standard one on %q", got, e.placedOn("a", "std"))
	}
	if got := e.placedOn("a", "std"); got != "" {
		t.Errorf("the standard claim took the room first: on %q", got)
	}
}

// bind binds a pod to a node and reserves its claim for it, as kube-scheduler does.
func (e *env) bind(ns, pod, claim, node string) {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(ns).Get(e.ctx, pod, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p.Spec.NodeName = node
	if _, err := e.client.CoreV1().Pods(ns).Update(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	c := e.claim(ns, claim)
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod, UID: p.UID}}
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// podGone is a pod's end as kube-controller-manager sees it through: the pod is removed and
// its claim's reservation for it with it.
func (e *env) podGone(ns, pod, claim string) {
	e.t.Helper()
	if err := e.client.CoreV1().Pods(ns).Delete(e.ctx, pod, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	c := e.claim(ns, claim)
	c.Status.ReservedFor = nil
	if _, err := e.client.ResourceV1().ResourceClaims(ns).UpdateStatus(e.ctx, c, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) gpuUse(node, dev string) (mem int64, tenants int) {
	u := e.c.model.UseOf(model.GPUKey{Pool: node, Device: dev})
	return u.Mem, u.Tenants
}

func (e *env) taintDevice(node, dev string, taint resourceapi.DeviceTaint) {
	e.t.Helper()
	s, err := e.client.ResourceV1().ResourceSlices().Get(e.ctx, node+"-"+api.DriverName, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := range s.Spec.Devices {
		if s.Spec.Devices[i].Name == dev {
			s.Spec.Devices[i].Taints = append(s.Spec.Devices[i].Taints, taint)
		}
	}
	if _, err := e.client.ResourceV1().ResourceSlices().Update(e.ctx, s, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// A fatal fault taints a GPU NoExecute; kube-controller-manager evicts its pods. Template
// claims go with their pods, a standalone claim loses its reservation: both release their
// shares, and the replacements go to the healthy GPU, never to the faulty one.
func TestEvictedPodsReleaseTheirClaims(t *testing.T) {
	e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 2, "80Gi"))
	for i, n := range []string{"r0", "r1", "solo"} {
		e.create(builders.MakeClaim("a", n).Memory("20Gi").Created(i).Obj(), builders.MakePod("a", n).Claim(n).Obj())
	}
	e.run()
	faulty := e.placedOn("a", "r0")
	for _, n := range []string{"r0", "r1", "solo"} {
		if got := e.placedOn("a", n); got != faulty {
			t.Fatalf("claim %s on %q, not with the others on %q", n, got, faulty)
		}
		e.bind("a", n, n, "n1")
	}
	e.run()
	node, dev, _ := cutKey(faulty)
	e.taintDevice(node, dev, resourceapi.DeviceTaint{Key: "fgpu.dev/gpu-fault", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
	e.run()
	// The eviction: template claims are deleted with their pods; the standalone claim stays.
	for _, n := range []string{"r0", "r1"} {
		e.podGone("a", n, n)
		_ = e.client.ResourceV1().ResourceClaims("a").Delete(e.ctx, n, metav1.DeleteOptions{})
	}
	e.podGone("a", "solo", "solo")
	e.run()
	if mem, n := e.gpuUse(node, dev); mem != 20<<30 || n != 1 {
		t.Fatalf("after the template claims went the faulty GPU holds %d bytes in %d shares; want the standalone claim's 20Gi only", mem, n)
	}
	e.clock.Step(e.c.cfg.OrphanGrace)
	e.run()
	if e.claim("a", "solo").Status.Allocation != nil {
		t.Fatal("the standalone claim of an evicted pod is still allocated")
	}
	if mem, n := e.gpuUse(node, dev); mem != 0 || n != 0 {
		t.Fatalf("the faulty GPU still holds %d bytes in %d shares", mem, n)
	}
	// The replacements: new template claims, and the standalone claim's new pod.
	for i, n := range []string{"r2", "r3"} {
		e.create(builders.MakeClaim("a", n).Memory("20Gi").Created(10+i).Obj(), builders.MakePod("a", n).Claim(n).Obj())
	}
	e.create(builders.MakePod("a", "solo2").Claim("solo").Obj())
	e.run()
	for _, n := range []string{"r2", "r3", "solo"} {
		if got := e.placedOn("a", n); got == "" || got == faulty {
			t.Errorf("replacement claim %s placed on %q (faulty: %s)", n, got, faulty)
		}
	}
	used := e.charged("a").Mem
	if used != 60<<30 {
		t.Errorf("namespace a counts %d bytes; want the three replacements' 60Gi", used)
	}
}

func cutKey(s string) (node, dev string, ok bool) {
	i := slices.Index([]byte(s), '/')
	if i < 0 {
		return "", "", false
	}
	return s[:i], s[i+1:], true
}

// A node goes NotReady: the node lifecycle controller taints it, evicts its pods, pod GC
// removes them once the node is deleted, its slices go with it. The claim's share on the
// lost node is counted once while its pod may still run there, released when the pod is
// gone, and never counted again (also when a node of the same name comes back); the
// replacement goes to the live node.
func TestNodeLossReleasesAndReplaces(t *testing.T) {
	for _, slicesGo := range []bool{false, true} {
		name := "slices linger"
		if slicesGo {
			name = "slices deleted"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil, builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"),
				builders.MakeClaim("a", "c").Memory("60Gi").Obj(), builders.MakePod("a", "p").Claim("c").Obj())
			e.run()
			if e.placedOn("a", "c") != "n1/gpu-0" {
				t.Fatal("not placed")
			}
			e.bind("a", "p", "c", "n1")
			e.create(builders.MakeNode("n2").Obj(), builders.MakeSlice("n2", 1, "80Gi"))
			e.run()

			// NotReady: the node lifecycle controller's taints; the pod is evicted but, its
			// kubelet unreachable, stays Terminating.
			n1, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n1", metav1.GetOptions{})
			n1.Spec.Taints = append(n1.Spec.Taints,
				corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule},
				corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute})
			_, _ = e.client.CoreV1().Nodes().Update(e.ctx, n1, metav1.UpdateOptions{})
			p, _ := e.client.CoreV1().Pods("a").Get(e.ctx, "p", metav1.GetOptions{})
			p.DeletionTimestamp = &metav1.Time{Time: e.clock.Now()}
			_, _ = e.client.CoreV1().Pods("a").Update(e.ctx, p, metav1.UpdateOptions{})
			// Its controller's replacement, with a claim from the template.
			e.create(builders.MakeClaim("a", "c2").Memory("60Gi").Created(5).Obj(), builders.MakePod("a", "p2").Claim("c2").Obj())
			if slicesGo {
				_ = e.client.CoreV1().Nodes().Delete(e.ctx, "n1", metav1.DeleteOptions{})
				_ = e.client.ResourceV1().ResourceSlices().Delete(e.ctx, "n1-"+api.DriverName, metav1.DeleteOptions{})
			}
			e.syncAll()
			if got := e.placedOn("a", "c2"); got != "n2/gpu-0" {
				t.Fatalf("the replacement's claim is on %q, want n2/gpu-0", got)
			}
			e.bind("a", "p2", "c2", "n2")
			e.syncAll()
			if mem, _ := e.gpuUse("n1", "gpu-0"); mem != 60<<30 {
				t.Errorf("while the pod may still run on n1 its share counts %d bytes there, want 60Gi", mem)
			}

			// Pod GC removes the pod; kube-controller-manager drops the reservation.
			e.clock.Step(time.Minute)
			e.podGone("a", "p", "c")
			e.clock.Step(e.c.cfg.OrphanGrace)
			e.run()
			if e.claim("a", "c").Status.Allocation != nil {
				t.Fatal("the lost node's claim is still allocated after its pod was removed")
			}
			if mem, n := e.gpuUse("n1", "gpu-0"); mem != 0 || n != 0 {
				t.Errorf("the lost node's GPU still counts %d bytes in %d shares", mem, n)
			}
			used := e.charged("a").Mem
			if used != 60<<30 {
				t.Errorf("namespace a counts %d bytes; want the replacement's 60Gi once", used)
			}

			// The node comes back: its GPU is empty, and takes the old claim's new pod.
			if slicesGo {
				e.create(builders.MakeNode("n1").Obj(), builders.MakeSlice("n1", 1, "80Gi"))
			} else {
				n1, _ := e.client.CoreV1().Nodes().Get(e.ctx, "n1", metav1.GetOptions{})
				n1.Spec.Taints = nil
				_, _ = e.client.CoreV1().Nodes().Update(e.ctx, n1, metav1.UpdateOptions{})
			}
			e.create(builders.MakePod("a", "p3").Claim("c").Obj())
			e.run()
			if got := e.placedOn("a", "c"); got != "n1/gpu-0" {
				t.Errorf("the old claim's new pod got %q, want n1/gpu-0", got)
			}
			if mem, n := e.gpuUse("n1", "gpu-0"); mem != 60<<30 || n != 1 {
				t.Errorf("n1's GPU counts %d bytes in %d shares, want 60Gi in one", mem, n)
			}
		})
	}
}
