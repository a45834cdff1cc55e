// Package fakekubelet runs the pods created through a fake clientset as local processes, as
// a kubelet would run their first container: enough for the MPS daemons' pods, whose command
// is the stand-in control binary, to answer on their pipe directories in unit tests.
package fakekubelet

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// Kubelet runs the pods of one fake clientset.
type Kubelet struct {
	t      testing.TB
	client *fake.Clientset

	mu sync.Mutex
	// Created counts pod creations; procs holds the running ones by pod name.
	created int
	procs   map[string]*exec.Cmd
	// NoStart leaves created pods waiting, with this reason (an image that is not there).
	NoStart string
}

// New installs the reactors on client; the pods' processes are stopped at the test's end.
// The Node objects the pods name must exist in client.
func New(t testing.TB, client *fake.Clientset) *Kubelet {
	k := &Kubelet{t: t, client: client, procs: map[string]*exec.Cmd{}}
	client.PrependReactor("create", "pods", k.create)
	client.PrependReactor("delete", "pods", k.delete)
	t.Cleanup(func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		for name := range k.procs {
			k.stopLocked(name)
		}
	})
	return k
}

// Node is a Node object for client.
func Node(name string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-node-" + name)}}
}

// Created is how many pods were created.
func (k *Kubelet) Created() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.created
}

// Kill ends a pod's process, as a crash or a tenant's quit would, and marks it Failed.
func (k *Kubelet) Kill(ns, name string) {
	k.mu.Lock()
	k.stopLocked(name)
	k.mu.Unlock()
	k.setStatus(ns, name, corev1.PodStatus{Phase: corev1.PodFailed})
}

func (k *Kubelet) create(action k8stesting.Action) (bool, runtime.Object, error) {
	create, ok := action.(k8stesting.CreateAction)
	if !ok {
		return false, nil, nil
	}
	pod, ok := create.GetObject().(*corev1.Pod)
	if !ok {
		return false, nil, nil
	}
	if _, err := k.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), pod.Namespace, pod.Name); err == nil {
		return false, nil, nil // the tracker answers AlreadyExists
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.created++
	pod = pod.DeepCopy()
	if reason, msg := k.admit(pod); reason != "" {
		pod.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: reason, Message: msg}
		return true, pod, k.client.Tracker().Add(pod)
	}
	if k.NoStart != "" {
		pod.Status = corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{{
			Name: pod.Spec.Containers[0].Name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: k.NoStart, Message: "image not present"}}}}}
		return true, pod, k.client.Tracker().Add(pod)
	}
	c := pod.Spec.Containers[0]
	cmd := exec.Command(c.Command[0], c.Command[1:]...)
	cmd.Env = os.Environ()
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return true, nil, fmt.Errorf("fake kubelet: start %v: %w", c.Command, err)
	}
	k.procs[pod.Name] = cmd
	pod.Status.Phase = corev1.PodRunning
	return true, pod, k.client.Tracker().Add(pod)
}

// admit refuses a pod as the kubelet's admission does where its node has allocatable
// resources set: when the node has no room for one more pod, or the pod requests CPU or
// memory (a pod requesting neither fits anywhere) beyond what the node's other running pods
// left.
func (k *Kubelet) admit(pod *corev1.Pod) (reason, msg string) {
	obj, err := k.client.Tracker().Get(corev1.SchemeGroupVersion.WithResource("nodes"), "", pod.Spec.NodeName)
	node, ok := obj.(*corev1.Node)
	if err != nil || !ok || node.Status.Allocatable == nil {
		return "", ""
	}
	list, err := k.client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "")
	if err != nil {
		k.t.Fatalf("fake kubelet: list pods: %v", err)
	}
	pods, ok := list.(*corev1.PodList)
	if !ok {
		k.t.Fatalf("fake kubelet: list pods gave a %T", list)
	}
	one := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(1, resource.DecimalSI)}
	used := corev1.ResourceList{}
	for _, p := range pods.Items {
		if p.Spec.NodeName == node.Name && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			add(used, requests(&p))
			add(used, one)
		}
	}
	wanted := requests(pod)
	add(wanted, one)
	for _, name := range []corev1.ResourceName{corev1.ResourcePods, corev1.ResourceCPU, corev1.ResourceMemory} {
		want, had, capacity := wanted[name], used[name], node.Status.Allocatable[name]
		total := had.DeepCopy()
		total.Add(want)
		if want.IsZero() || total.Cmp(capacity) <= 0 {
			continue
		}
		return "OutOf" + string(name), fmt.Sprintf("Pod was rejected: Node didn't have enough resource: %s, requested: %s, used: %s, capacity: %s",
			name, want.String(), had.String(), capacity.String())
	}
	return "", ""
}

// requests sums a pod's containers' requests.
func requests(pod *corev1.Pod) corev1.ResourceList {
	out := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		add(out, c.Resources.Requests)
	}
	return out
}

func add(to, more corev1.ResourceList) {
	for name, q := range more {
		sum := to[name]
		sum.Add(q)
		to[name] = sum
	}
}

func (k *Kubelet) delete(action k8stesting.Action) (bool, runtime.Object, error) {
	del, ok := action.(k8stesting.DeleteAction)
	if !ok {
		return false, nil, nil
	}
	name := del.GetName()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked(name)
	return false, nil, nil
}

// stopLocked ends a pod's process as the kubelet does: SIGTERM, then SIGKILL.
func (k *Kubelet) stopLocked(name string) {
	cmd := k.procs[name]
	if cmd == nil {
		return
	}
	delete(k.procs, name)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

func (k *Kubelet) setStatus(ns, name string, st corev1.PodStatus) {
	gvr := corev1.SchemeGroupVersion.WithResource("pods")
	obj, err := k.client.Tracker().Get(gvr, ns, name)
	if err != nil {
		k.t.Fatalf("fake kubelet: pod %s/%s: %v", ns, name, err)
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		k.t.Fatalf("fake kubelet: %s/%s is a %T, not a pod", ns, name, obj)
	}
	pod = pod.DeepCopy()
	pod.Status = st
	if err := k.client.Tracker().Update(gvr, pod, ns); err != nil {
		k.t.Fatal(err)
	}
}
