package mps

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strings"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Labels of a daemon's pod, besides fgpu's own (api.LabelMPSDaemon, LabelMPSGPU, LabelMPSNode).
const (
	ComponentLabel = "app.kubernetes.io/component"
	// Component is ComponentLabel's value on every daemon pod.
	Component = "mps-daemon"
)

// SafeToEvictAnnotation tells the cluster autoscaler whether it may evict a pod when it
// removes a node; a daemon pod says "true", and its disruption budget holds it while its
// clients may not be evicted.
const SafeToEvictAnnotation = "cluster-autoscaler.kubernetes.io/safe-to-evict"

// DriverRootPath is where a daemon pod sees the host's driver root, whose
// nvidia-cuda-mps-control it runs.
const DriverRootPath = "/driver-root"

// PodLauncher runs each control daemon in a pod of its own on this node, in the plugin's
// namespace, so that it outlives the plugin's container (restarts, rollouts, upgrades). The
// pod's name derives from node and key: two plugins, or a plugin and its predecessor, can
// never both start one, and a restarted plugin finds (adopts) the pods it needs.
type PodLauncher struct {
	Client    kubernetes.Interface
	Namespace string
	NodeName  string
	// Image is the plugin's own image: it carries the stand-in for fake GPUs.
	Image      string
	PullPolicy corev1.PullPolicy
	// DriverRoot is the host's driver root, mounted at DriverRootPath, whose
	// nvidia-cuda-mps-control runs (found on PATH); empty: the control binary is in Image.
	DriverRoot string
	// HostPaths are more host directories the daemon needs at their own paths (the fake
	// GPUs' process files).
	HostPaths []string
	// StopTimeout bounds the wait for a deleted pod to be gone (default 30s).
	StopTimeout time.Duration
	// ServiceAccount runs the pods (empty: the namespace's default); its token is never
	// mounted. The chart's admission policy admits only its own, which has no RBAC.
	ServiceAccount string
	// PriorityClass of the pods (the chart's sits below the critical classes: the kubelet
	// evicts other pods to admit a critical one on a full node).
	PriorityClass string
}

// PodName is the daemon's pod: a hash of node and key, so one node's daemons never collide
// with another's in the shared namespace.
func (l *PodLauncher) PodName(key string) string {
	sum := sha256.Sum256([]byte(l.NodeName + "/" + key))
	return fmt.Sprintf("fgpu-mps-%x", sum[:10])
}

// Start implements Launcher.
func (l *PodLauncher) Start(ctx context.Context, spec DaemonSpec, replace bool) (bool, error) {
	pods := l.Client.CoreV1().Pods(l.Namespace)
	name := l.PodName(spec.Key)
	existing, err := pods.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, fmt.Errorf("get pod %s/%s: %w", l.Namespace, name, err)
	case existing.DeletionTimestamp == nil && !finished(existing) && (!replace || !ran(existing)):
		return false, nil
	default:
		// Exited (a tenant's quit, a crash, refused by the kubelet), on its way out, or
		// running without answering (a tenant removed its control socket): its defaults are
		// lost or out of reach. Its disruption budget stays, for the new pod.
		if err := l.removePod(ctx, spec.Key); err != nil {
			return false, err
		}
	}
	// A daemon killed with its pod leaves its pipe files; a new one needs them gone.
	if err := clearDir(spec.PipeDir); err != nil {
		return false, err
	}
	pod, err := l.pod(ctx, spec)
	if err != nil {
		return false, err
	}
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return false, fmt.Errorf("create pod %s/%s: %w", l.Namespace, name, err)
	}
	return true, nil
}

// Stop implements Launcher. A deletion, not an eviction: the daemon's disruption budget
// does not hold it, and goes with it.
func (l *PodLauncher) Stop(ctx context.Context, key string) error {
	if err := l.removePod(ctx, key); err != nil {
		return err
	}
	return l.Protect(ctx, key, false)
}

// removePod deletes daemon key's pod and returns once it is gone (bounded).
func (l *PodLauncher) removePod(ctx context.Context, key string) error {
	pods := l.Client.CoreV1().Pods(l.Namespace)
	name := l.PodName(key)
	if err := pods.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s/%s: %w", l.Namespace, name, err)
	}
	timeout := l.StopTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		_, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("pod %s/%s is not gone %s after its deletion: %s", l.Namespace, name, timeout, l.Describe(ctx, key))
	}
	return nil
}

// Protect gives daemon key's pod a PodDisruptionBudget that refuses its eviction (a drain's,
// the cluster autoscaler's) while protect holds, or removes it. The plugin protects a daemon
// while it has clients that a drain evicts (they go first, as their own budgets allow) and
// deletes the pod itself after the last one; a drain then ends. The budget has the pod's
// name and, like the pod, is owned by the Node. Idempotent.
func (l *PodLauncher) Protect(ctx context.Context, key string, protect bool) error {
	budgets := l.Client.PolicyV1().PodDisruptionBudgets(l.Namespace)
	name := l.PodName(key)
	_, err := budgets.Get(ctx, name, metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("get the disruption budget %s/%s of MPS daemon %s: %w", l.Namespace, name, key, err)
	}
	switch exists := err == nil; {
	case exists == protect:
		return nil
	case exists:
		if err := budgets.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("delete the disruption budget %s/%s of MPS daemon %s: %w", l.Namespace, name, key, err)
		}
		return nil
	}
	nodeUID, err := l.node(ctx)
	if err != nil {
		return err
	}
	budget := &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: l.Namespace, Labels: map[string]string{"app.kubernetes.io/name": "fgpu", ComponentLabel: Component},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: l.NodeName, UID: nodeUID}},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			// An integer: a percentage or maxUnavailable needs the pods' controller, which
			// a daemon pod has none of.
			MinAvailable: ptr.To(intstr.FromInt32(1)),
			Selector:     &metav1.LabelSelector{MatchLabels: l.selector(key)},
		},
	}
	if _, err := budgets.Create(ctx, budget, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the disruption budget %s/%s of MPS daemon %s: %w", l.Namespace, name, key, err)
	}
	return nil
}

// selector picks daemon key's pod (on this node, where its name is a label value).
func (l *PodLauncher) selector(key string) map[string]string {
	labels := map[string]string{ComponentLabel: Component, api.LabelMPSDaemon: key}
	if len(validation.IsValidLabelValue(l.NodeName)) == 0 {
		labels[api.LabelMPSNode] = l.NodeName
	}
	return labels
}

// Keys implements Launcher.
func (l *PodLauncher) Keys(ctx context.Context) ([]string, error) {
	list, err := l.Client.CoreV1().Pods(l.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: ComponentLabel + "=" + Component + "," + api.LabelMPSDaemon,
		FieldSelector: "spec.nodeName=" + l.NodeName,
	})
	if err != nil {
		return nil, fmt.Errorf("list the MPS daemon pods of node %s: %w", l.NodeName, err)
	}
	var keys []string
	for _, p := range list.Items {
		if p.Spec.NodeName == l.NodeName && p.Name == l.PodName(p.Labels[api.LabelMPSDaemon]) {
			keys = append(keys, p.Labels[api.LabelMPSDaemon])
		}
	}
	return keys, nil
}

// Describe implements Launcher.
func (l *PodLauncher) Describe(ctx context.Context, key string) string {
	name := l.PodName(key)
	p, err := l.Client.CoreV1().Pods(l.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return fmt.Sprintf("pod %s/%s: %v", l.Namespace, name, err)
	}
	parts := []string{string(p.Status.Phase)}
	if p.Status.Reason != "" {
		// Set where the kubelet refused the pod (OutOfcpu, OutOfpods, ...) or evicted it.
		parts = append(parts, p.Status.Reason+": "+p.Status.Message)
	}
	if p.DeletionTimestamp != nil {
		parts = append(parts, "being deleted")
	}
	for _, c := range p.Status.ContainerStatuses {
		switch {
		case c.State.Waiting != nil:
			parts = append(parts, fmt.Sprintf("container %s waiting: %s %s", c.Name, c.State.Waiting.Reason, c.State.Waiting.Message))
		case c.State.Terminated != nil:
			parts = append(parts, fmt.Sprintf("container %s exited %d: %s %s", c.Name, c.State.Terminated.ExitCode, c.State.Terminated.Reason, c.State.Terminated.Message))
		}
	}
	return fmt.Sprintf("pod %s/%s: %s", l.Namespace, name, strings.Join(parts, "; "))
}

func finished(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// ran says the pod's daemon was started (it runs or its container exited): a pod still
// pulling its image or waiting to start is not.
func ran(p *corev1.Pod) bool {
	if p.Status.Phase == corev1.PodRunning {
		return true
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.State.Running != nil || c.State.Terminated != nil {
			return true
		}
	}
	return false
}

// pod is the daemon's pod. The daemon runs in the node's PID namespace (an MPS daemon in a
// PID namespace of its own is known to leave limits unenforced) and IPC namespace, with the
// daemon's shm directory, which its clients mount, as its /dev/shm. It tolerates every taint
// (evicting it would break every client) and is restarted by the plugin, not the kubelet: a
// restarted daemon has lost the defaults the plugin set.
//
// It requests no CPU and no memory: the kubelet admits a pod bound to its node only if its
// requests fit what other pods left, and a tenant that filled the node's requests would
// otherwise keep every other domain's daemon, hence its pods, from starting. The room the
// daemons use is requested by the plugin's own pod instead (the chart's
// kubeletPlugin.podRequests). No limits either: a memory limit would OOM-kill a server with
// all its clients, a CPU limit throttle them all.
func (l *PodLauncher) pod(ctx context.Context, spec DaemonSpec) (*corev1.Pod, error) {
	nodeUID, err := l.node(ctx)
	if err != nil {
		return nil, err
	}
	labels := l.selector(spec.Key)
	labels["app.kubernetes.io/name"] = "fgpu"
	if len(validation.IsValidLabelValue(spec.GPUUUID)) == 0 {
		labels[api.LabelMPSGPU] = spec.GPUUUID
	}
	hostPath := func(name, path string) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(corev1.HostPathDirectory)}}}
	}
	volumes := []corev1.Volume{hostPath("daemon", spec.Dir), hostPath("shm", spec.ShmDir)}
	mounts := []corev1.VolumeMount{{Name: "daemon", MountPath: spec.Dir}, {Name: "shm", MountPath: "/dev/shm"}}
	for i, p := range l.HostPaths {
		name := fmt.Sprintf("host-%d", i)
		volumes = append(volumes, hostPath(name, p))
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: p})
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	var env []corev1.EnvVar
	if l.DriverRoot != "" {
		volumes = append(volumes, hostPath("driver-root", l.DriverRoot))
		mounts = append(mounts, corev1.VolumeMount{Name: "driver-root", MountPath: DriverRootPath, ReadOnly: true})
		path = DriverRootPath + "/usr/bin:" + DriverRootPath + "/usr/sbin:" + path
		env = append(env, corev1.EnvVar{Name: "LD_LIBRARY_PATH", Value: DriverRootPath + "/usr/lib/x86_64-linux-gnu:" + DriverRootPath + "/usr/lib64:" + DriverRootPath + "/usr/lib"})
	}
	env = append(env, corev1.EnvVar{Name: "PATH", Value: path})
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		env = append(env, corev1.EnvVar{Name: k, Value: v})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: l.PodName(spec.Key), Namespace: l.Namespace, Labels: labels,
			// The cluster autoscaler may take a daemon with its node: one whose clients may
			// not be evicted is held by its disruption budget (Protect), which the autoscaler
			// respects as a drain does. "false" would keep every idle node with a spare.
			Annotations: map[string]string{SafeToEvictAnnotation: "true"},
			// The node's garbage collection removes the node's daemons with it. The plugin
			// is their controller, in the Node's name: kubectl drain evicts a pod with a
			// controller (subject to its budget) without --force.
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: l.NodeName, UID: nodeUID, Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			NodeName:                      l.NodeName,
			HostPID:                       true,
			HostIPC:                       true,
			HostNetwork:                   true,
			RestartPolicy:                 corev1.RestartPolicyNever,
			PriorityClassName:             l.PriorityClass,
			ServiceAccountName:            l.ServiceAccount,
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			Volumes:                       volumes,
			Containers: []corev1.Container{{
				Name:            "mps-control",
				Image:           l.Image,
				ImagePullPolicy: l.PullPolicy,
				Command:         spec.Command,
				Env:             env,
				VolumeMounts:    mounts,
				// GPU device nodes and compute modes.
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
			}},
		},
	}, nil
}

// node is the Node's UID, read at each pod creation: a Node deleted and registered again
// under the same name has a new UID, and a pod owned by the old one is garbage collected.
func (l *PodLauncher) node(ctx context.Context) (types.UID, error) {
	n, err := l.Client.CoreV1().Nodes().Get(ctx, l.NodeName, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get node %s for the MPS daemon pod's owner: %w", l.NodeName, err)
	}
	return n.UID, nil
}
