package plugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/dmem"
)

// ReasonCgroupMemoryNotCapped is the Warning event on a pod whose cgroup did not get its claims'
// GPU memory cap: each of its MPS client processes is still capped, the pod as a whole is not.
const ReasonCgroupMemoryNotCapped = "FgpuCgroupMemoryNotCapped"

// The kubelet makes a pod's cgroup before it prepares the pod's claims (Kubelet.SyncPod, then
// the runtime's SyncPod prepares the claims before the sandbox), so it is normally there; if
// not, it is looked for this long, then the pod gets an event.
const (
	cgroupWait = time.Minute
	cgroupPoll = 500 * time.Millisecond
)

// detectCgroupCaps finds the GPUs whose memory the kernel's dmem controller partitions: the
// driver lists nvidia/<pci bus id>/vidmem in dmem.capacity of a cgroup v2 root.
func (s *State) detectCgroupCaps(ctx context.Context) {
	logger := klog.FromContext(ctx)
	s.dmemRegions = map[string]string{}
	if s.cfg.CgroupRoot == "" {
		return
	}
	s.cgroups = dmem.Root{Path: s.cfg.CgroupRoot}
	capacity, err := s.cgroups.Capacity()
	if err != nil {
		logger.Info("GPU memory is capped per MPS client process only: no per-cgroup GPU memory limits", "reason", err.Error())
		return
	}
	for _, d := range s.devices {
		region := dmem.Region(d.PCIBusID)
		if _, ok := capacity[region]; ok && d.PCIBusID != "" {
			s.dmemRegions[d.UUID] = region
		}
		logger.Info("GPU memory enforcement", "device", d.Name(), "uuid", d.UUID, "memoryCap", memoryCap("mps", s.dmemRegions[d.UUID] != ""), "dmemRegion", region)
	}
}

// CgroupCaps says which devices (by name) cap MPS shares per pod through the cgroup.
func (s *State) CgroupCaps() map[string]bool {
	out := map[string]bool{}
	for name, d := range s.devices {
		out[name] = s.dmemRegions[d.UUID] != ""
	}
	return out
}

// limitPod sets the pod's dmem.max on each GPU it holds cgroup-capped shares of: the sum of the
// caps of all its prepared claims there (several claims of one pod on one GPU add up). Regions
// in also get cleared ("max") where no claim of the pod is left. The caller holds s.mu.
func (s *State) limitPod(uid string, also map[string]bool) error {
	want := map[string]int64{}
	for r := range also {
		want[r] = 0
	}
	for _, e := range s.cp.Claims {
		if !slices.ContainsFunc(e.Pods, func(p checkpoint.PodRef) bool { return p.UID == uid }) {
			continue
		}
		for _, p := range e.Devices {
			if r := s.dmemRegions[p.GPUUUID]; r != "" && p.MemoryCap == MemoryCapCgroup {
				want[r] += p.MemoryLimitBytes
			}
		}
	}
	if len(want) == 0 {
		return nil
	}
	cg, err := s.cgroups.PodCgroup(uid)
	if err != nil {
		return err
	}
	var errs []error
	for r, bytes := range want {
		errs = append(errs, s.cgroups.SetMax(cg, r, bytes))
	}
	return errors.Join(errs...)
}

// limitPods applies the cgroup caps of a prepared claim to some of its pods: a pod whose cgroup
// cannot be limited gets an event (failed is true), one whose cgroup is not there yet is waited
// for in the background. The caller holds s.mu.
func (s *State) limitPods(ctx context.Context, e *checkpoint.ClaimEntry, pods []checkpoint.PodRef) (failed bool) {
	if !slices.ContainsFunc(e.Devices, func(p checkpoint.PreparedDevice) bool { return p.MemoryCap == MemoryCapCgroup }) {
		return false
	}
	for _, pod := range pods {
		err := s.limitPod(pod.UID, nil)
		switch {
		case err == nil:
		case errors.Is(err, dmem.ErrNoCgroup):
			go s.awaitPodCgroup(e.Namespace, pod)
		default:
			s.notCapped(ctx, e.Namespace, pod, err)
			failed = true
		}
	}
	return failed
}

// cappedPerProcess tells a claim whose pod could not be limited, before its CDI spec is
// written, that its processes are capped one by one only.
func cappedPerProcess(e *checkpoint.ClaimEntry) {
	for i := range e.Devices {
		p := &e.Devices[i]
		if p.MemoryCap == MemoryCapCgroup {
			p.MemoryCap = MemoryCapMPSPerProcess
			p.MemoryEnforcement = perProcessWhy + strings.TrimPrefix(p.MemoryEnforcement, cgroupWhy)
		}
	}
}

// awaitPodCgroup applies a pod's caps once its cgroup appears. Until then the pod's containers,
// if already running, are capped per MPS client process only.
func (s *State) awaitPodCgroup(ns string, pod checkpoint.PodRef) {
	ctx := s.background
	deadline := time.Now().Add(cgroupWait)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(cgroupPoll):
		}
		s.mu.Lock()
		err := s.limitPod(pod.UID, nil)
		s.mu.Unlock()
		if err == nil {
			return
		}
		if !errors.Is(err, dmem.ErrNoCgroup) || time.Now().After(deadline) {
			s.notCapped(ctx, ns, pod, err)
			return
		}
	}
}

// unlimitPods recomputes the caps of a removed claim's pods: what their other claims on the
// GPU still hold, or none. A pod already gone (its cgroup removed) needs nothing.
func (s *State) unlimitPods(ctx context.Context, e *checkpoint.ClaimEntry) {
	regions := map[string]bool{}
	for _, p := range e.Devices {
		if r := s.dmemRegions[p.GPUUUID]; r != "" && p.MemoryCap == MemoryCapCgroup {
			regions[r] = true
		}
	}
	if len(regions) == 0 {
		return
	}
	for _, pod := range e.Pods {
		if err := s.limitPod(pod.UID, regions); err != nil && !errors.Is(err, dmem.ErrNoCgroup) {
			klog.FromContext(ctx).Error(err, "Lifting a released claim's GPU memory cap from its pod's cgroup", "pod", klog.KRef(e.Namespace, pod.Name), "podUID", pod.UID)
		}
	}
}

func (s *State) notCapped(ctx context.Context, ns string, pod checkpoint.PodRef, err error) {
	msg := fmt.Sprintf("GPU memory of pod %s is not capped as a whole (cgroup dmem.max): %v; each of its MPS client processes stays capped at its claim's limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)", pod.Name, err)
	klog.FromContext(ctx).Error(err, "Cannot cap a pod's GPU memory through its cgroup", "pod", klog.KRef(ns, pod.Name), "podUID", pod.UID)
	if s.podEvent != nil {
		s.podEvent(ctx, ns, pod, ReasonCgroupMemoryNotCapped, msg)
	}
}

// podsOf are the pods of this node the claim is reserved for, each checked against the API
// (same UID, bound to this node): the UID then comes from the API server, not from anything a
// tenant wrote. Only asked where a GPU is cgroup-capped.
func (d *Driver) podsOf(ctx context.Context, claim *resourceapi.ResourceClaim) []checkpoint.PodRef {
	if len(d.state.dmemRegions) == 0 {
		return nil
	}
	var out []checkpoint.PodRef
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.client.CoreV1().Pods(claim.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
		if err != nil {
			klog.FromContext(ctx).Error(err, "Looking up a pod of a claim for its GPU memory cgroup cap", "claim", klog.KObj(claim), "pod", ref.Name)
			continue
		}
		if pod.UID != ref.UID || pod.Spec.NodeName != d.cfg.NodeName {
			continue
		}
		out = append(out, checkpoint.PodRef{UID: string(pod.UID), Name: pod.Name})
	}
	return out
}

func (d *Driver) podEvent(ctx context.Context, ns string, pod checkpoint.PodRef, reason, msg string) {
	if len(msg) > maxEventMessage {
		msg = msg[:maxEventMessage-3] + "..."
	}
	now := metav1.Now()
	ev := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: pod.Name + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: pod.Name, UID: types.UID(pod.UID)},
		Reason:         reason, Message: msg, Type: corev1.EventTypeWarning,
		Source:         corev1.EventSource{Component: "fgpu-kubelet-plugin", Host: d.cfg.NodeName},
		FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if _, err := d.client.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		klog.FromContext(ctx).Error(err, "Recording a pod event", "pod", klog.KRef(ns, pod.Name), "reason", reason)
	}
}
