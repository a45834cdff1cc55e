package plugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/prometheus/client_golang/prometheus"
)

// gpu-0 of the fake fleet, as dmem.capacity names it.
const gpu0Region = "nvidia/0000:18:00.0/vidmem"

// cgroupRoot lays out a fake cgroup v2 root whose dmem controller partitions gpu-0 only.
func (e *env) cgroupRoot() string {
	e.t.Helper()
	root := e.t.TempDir()
	writeFile(e.t, filepath.Join(root, "cgroup.controllers"), "cpu memory pids dmem\n")
	writeFile(e.t, filepath.Join(root, "cgroup.subtree_control"), "cpu memory pids\n")
	writeFile(e.t, filepath.Join(root, "dmem.capacity"), gpu0Region+" 85899345920\n")
	e.cfg.CgroupRoot = root
	return root
}

// podCgroup makes a burstable pod's cgroup (cgroupfs driver) and returns its dmem.max.
func podCgroup(t testing.TB, root, uid string) string {
	t.Helper()
	dir := ""
	for _, part := range []string{"kubepods", "burstable", "pod" + uid} {
		dir = filepath.Join(dir, part)
		writeFile(t, filepath.Join(root, dir, "cgroup.subtree_control"), "")
		writeFile(t, filepath.Join(root, dir, "dmem.max"), "")
	}
	return filepath.Join(root, dir, "dmem.max")
}

func writeFile(t testing.TB, p, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const podA = "11111111-2222-3333-4444-555555555555"

func TestCgroupCapDetection(t *testing.T) {
	for name, withRoot := range map[string]bool{"dmem lists gpu-0": true, "no cgroup v2 dmem": false} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			if withRoot {
				podCgroup(t, e.cgroupRoot(), podA)
			} else {
				e.cfg.CgroupRoot = t.TempDir() // a cgroup v1 node: no cgroup.controllers
			}
			s := e.state()
			res := DriverResources(node, s.Devices(), e.cfg.ReservedMemory, false, nil, nil, s.CgroupCaps()).Pools[node].Slices[0].Devices
			want0 := MemoryCapMPSPerProcess
			if withRoot {
				want0 = MemoryCapCgroup
			}
			for i, want := range []string{want0, MemoryCapMPSPerProcess} {
				if got := *res[i].Attributes["memoryCap"].StringValue; got != want {
					t.Errorf("%s memoryCap=%s, want %s", res[i].Name, got, want)
				}
			}
			for _, c := range []struct {
				claim    *resourceapi.ResourceClaim
				cap, why string
			}{
				{builders.MakeClaim("ns", "mps").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj(), want0, map[bool]string{true: "cgroup: the pod's processes together", false: "mps: caps each MPS client process"}[withRoot]},
				{builders.MakeClaim("ns", "mps1").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj(), MemoryCapMPSPerProcess, "mps: caps each MPS client process"},
				{builders.MakeClaim("ns", "ts").Memory("10Gi").Config(map[string]any{"mode": "timeSlicing"}).AllocatedOn(node, "gpu-1").Obj(), MemoryCapNone, "time-slicing: no memory cap"},
			} {
				if _, err := s.PrepareFor(context.Background(), c.claim, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
					t.Fatal(err)
				}
				env := e.specEnv(string(c.claim.UID))
				if !slices.Contains(env, "FGPU_MEMORY_CAP="+c.cap) {
					t.Errorf("%s: want FGPU_MEMORY_CAP=%s: %v", c.claim.Name, c.cap, env)
				}
				if got := s.cp.Claims[string(c.claim.UID)].Devices[0].MemoryEnforcement; !strings.HasPrefix(got, c.why) {
					t.Errorf("%s: FGPU_MEMORY_ENFORCEMENT=%q, want it to start %q", c.claim.Name, got, c.why)
				}
			}
		})
	}
}

// Two claims of one pod on one GPU add up in its dmem.max; unprepare lifts each share.
func TestCgroupCapTwoClaimsOnePod(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	max := podCgroup(t, root, podA)
	s := e.state()
	ctx := context.Background()
	pods := []checkpoint.PodRef{{UID: podA, Name: "a"}}
	c1 := builders.MakeClaim("ns", "c1").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	c2 := builders.MakeClaim("ns", "c2").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, c1, pods); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, max); got != gpu0Region+" 10737418240\n" {
		t.Errorf("one claim: dmem.max %q", got)
	}
	if _, err := s.PrepareFor(ctx, c2, pods); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, max); got != gpu0Region+" 32212254720\n" {
		t.Errorf("two claims: dmem.max %q", got)
	}
	if !slices.Contains(e.specEnv(string(c2.UID)), "FGPU_MEMORY_CAP=cgroup") {
		t.Errorf("c2 env %v", e.specEnv(string(c2.UID)))
	}
	// A restarted plugin knows the pods from its checkpoint.
	s = e.state()
	if err := s.Unprepare(ctx, string(c1.UID)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, max); got != gpu0Region+" 21474836480\n" {
		t.Errorf("after c1 went: dmem.max %q", got)
	}
	if err := s.Unprepare(ctx, string(c2.UID)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, max); got != gpu0Region+" max\n" {
		t.Errorf("after both went: dmem.max %q", got)
	}
}

func TestCgroupCapPodCgroupAppearsLate(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	s := e.state()
	claim := builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(context.Background(), claim, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	max := podCgroup(t, root, podA)
	deadline := time.Now().Add(5 * time.Second)
	for readFile(t, max) != gpu0Region+" 10737418240\n" {
		if time.Now().After(deadline) {
			t.Fatalf("dmem.max %q after the pod's cgroup appeared", readFile(t, max))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A pod whose cgroup cannot be limited gets an event, and its claim says it is capped per
// process only.
func TestCgroupCapFailureFallsBackToPerProcess(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	podCgroup(t, root, podA)
	if err := os.Remove(filepath.Join(root, "kubepods", "cgroup.subtree_control")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "kubepods", "cgroup.subtree_control"), 0o755); err != nil {
		t.Fatal(err) // unwritable, as when the kernel refuses to enable the controller
	}
	s := e.state()
	var mu sync.Mutex
	var events []string
	s.caps.podEvent = func(_ context.Context, ns string, pod checkpoint.PodRef, reason, msg string) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ns+"/"+pod.Name+" "+reason+": "+msg)
	}
	claim := builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(context.Background(), claim, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	env := e.specEnv(string(claim.UID))
	if !slices.Contains(env, "FGPU_MEMORY_CAP=mps-per-process") || !slices.Contains(env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M") {
		t.Errorf("env %v", env)
	}
	if len(events) != 1 || !strings.HasPrefix(events[0], "ns/a "+ReasonCgroupMemoryNotCapped) || !strings.Contains(events[0], "stays capped") {
		t.Errorf("events %q", events)
	}
}

// The pod's cgroup is picked by the UID the API server holds for a pod bound to this node, not
// by what the claim's reservedFor says alone.
func TestPodsOfChecksTheAPI(t *testing.T) {
	e := newEnv(t)
	e.cgroupRoot()
	s := e.state()
	pod := func(name, uid, nodeName string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)}, Spec: corev1.PodSpec{NodeName: nodeName}}
	}
	client := k8sfake.NewClientset(
		pod("a", podA, node),
		pod("other-node", "22222222-2222-3333-4444-555555555555", "node-b"),
		pod("replaced", "33333333-2222-3333-4444-555555555555", node),
	)
	d := &Driver{state: s, client: client, cfg: e.cfg}
	claim := builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
		{Resource: "pods", Name: "a", UID: podA},
		{Resource: "pods", Name: "other-node", UID: "22222222-2222-3333-4444-555555555555"},
		{Resource: "pods", Name: "replaced", UID: "44444444-2222-3333-4444-555555555555"},
		{Resource: "pods", Name: "missing", UID: "55555555-2222-3333-4444-555555555555"},
		{APIGroup: "example.com", Resource: "pods", Name: "a", UID: podA},
	}
	got, err := d.podsOf(context.Background(), claim)
	if err != nil {
		t.Fatal(err)
	}
	if want := []checkpoint.PodRef{{UID: podA, Name: "a"}}; !slices.Equal(got, want) {
		t.Errorf("pods %+v, want %+v", got, want)
	}
}

// A claim prepared with no pod whose cgroup was capped (none known, as for a prepare whose
// pods could not be looked up) must not say its pod is capped as a whole.
func TestCgroupCapNoPodCappedIsPerProcess(t *testing.T) {
	e := newEnv(t)
	e.cgroupRoot()
	s := e.state()
	claim := builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(context.Background(), claim, nil); err != nil {
		t.Fatal(err)
	}
	if env := e.specEnv(string(claim.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=mps-per-process") {
		t.Errorf("no pod's cgroup was capped, yet the claim's env is %v", env)
	}
}

// dmem.max charges every process of the pod's cgroup: a pod that also holds a time-sliced
// share of the GPU must not be capped at its MPS claim's limit, and that claim then says it is
// capped per process only, whichever of the two was prepared first.
func TestCgroupCapTimeSlicedShareLiftsThePodsCap(t *testing.T) {
	for _, mpsFirst := range []bool{false, true} {
		t.Run(map[bool]string{false: "time-sliced first", true: "MPS first"}[mpsFirst], func(t *testing.T) {
			e := newEnv(t)
			root := e.cgroupRoot()
			max := podCgroup(t, root, podA)
			s := e.state()
			ctx := context.Background()
			pods := []checkpoint.PodRef{{UID: podA, Name: "a"}}
			mpsClaim := builders.MakeClaim("ns", "m").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
			ts := builders.MakeClaim("ns", "t").Memory("20Gi").Config(map[string]any{"mode": "timeSlicing"}).AllocatedOn(node, "gpu-0").Obj()
			order := []*resourceapi.ResourceClaim{ts, mpsClaim}
			if mpsFirst {
				order = []*resourceapi.ResourceClaim{mpsClaim, ts}
			}
			for _, c := range order {
				if _, err := s.PrepareFor(ctx, c, pods); err != nil {
					t.Fatal(err)
				}
			}
			if got := readFile(t, max); got != gpu0Region+" max\n" {
				t.Errorf("dmem.max %q: the pod's time-sliced claim must not be squeezed under its MPS claim's cap", got)
			}
			if env := e.specEnv(string(mpsClaim.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=mps-per-process") {
				t.Errorf("MPS claim env %v", env)
			}
			if got := s.cp.Claims[string(mpsClaim.UID)].Devices[0].MemoryCap; got != MemoryCapMPSPerProcess {
				t.Errorf("MPS claim's memoryCap %s", got)
			}
			// Without the time-sliced share, the pod is capped at what it holds again.
			if err := s.Unprepare(ctx, string(ts.UID)); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, max); got != gpu0Region+" 10737418240\n" {
				t.Errorf("after the time-sliced claim went: dmem.max %q", got)
			}
		})
	}
}

const podB = "66666666-2222-3333-4444-555555555555"

// One pod of a shared claim cannot be capped: the claim says mps-per-process, but the pod that
// was capped keeps counting the claim, so its dmem.max never drops below what it holds.
func TestCgroupCapPartialFailureKeepsCappedPodsAtWhatTheyHold(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	maxA := podCgroup(t, root, podA)
	podCgroup(t, root, podB)
	// pod B's dmem.max cannot be written (the kernel refuses, or it is not a file).
	bMax := filepath.Join(root, "kubepods", "burstable", "pod"+podB, "dmem.max")
	if err := os.Remove(bMax); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bMax, 0o755); err != nil {
		t.Fatal(err)
	}
	s := e.state()
	s.caps.podEvent = func(context.Context, string, checkpoint.PodRef, string, string) {}
	ctx := context.Background()
	shared := builders.MakeClaim("ns", "shared").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	own := builders.MakeClaim("ns", "own").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.PrepareFor(ctx, shared, []checkpoint.PodRef{{UID: podA, Name: "a"}, {UID: podB, Name: "b"}}); err != nil {
		t.Fatal(err)
	}
	if env := e.specEnv(string(shared.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=mps-per-process") {
		t.Errorf("shared claim env %v", env)
	}
	if _, err := s.PrepareFor(ctx, own, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, maxA); got != gpu0Region+" 32212254720\n" {
		t.Errorf("pod a holds 10Gi+20Gi on gpu-0, dmem.max %q", got)
	}
	if err := s.Unprepare(ctx, string(own.UID)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, maxA); got != gpu0Region+" 10737418240\n" {
		t.Errorf("pod a holds 10Gi on gpu-0, dmem.max %q", got)
	}
	if err := s.Unprepare(ctx, string(shared.UID)); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, maxA); got != gpu0Region+" max\n" {
		t.Errorf("pod a holds nothing, dmem.max %q", got)
	}
}

// A pod that cannot be looked up fails the prepare (the kubelet retries) instead of being left
// out of its claim's caps.
func TestPodsOfFailsOnAPIError(t *testing.T) {
	e := newEnv(t)
	e.cgroupRoot()
	s := e.state()
	client := k8sfake.NewClientset()
	client.PrependReactor("get", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("etcdserver: request timed out")
	})
	d := &Driver{state: s, client: client, cfg: e.cfg, metrics: NewMetrics(prometheus.NewRegistry())}
	claim := builders.MakeClaim("ns", "c").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "a", UID: podA}}
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
	if err != nil {
		t.Fatal(err)
	}
	if res[claim.UID].Err == nil || !strings.Contains(res[claim.UID].Err.Error(), "request timed out") {
		t.Errorf("prepare result %+v, want the lookup's error", res[claim.UID])
	}
	if _, ok := s.PreparedClaims()[string(claim.UID)]; ok {
		t.Errorf("the claim was prepared without its pod")
	}
}

// The kubelet prepares a claim once per node: a second pod sharing it is found by the pod
// watch and capped, once the claim read from the API is reserved for it.
func TestCgroupCapPodJoiningAPreparedClaim(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	podCgroup(t, root, podA)
	maxB := podCgroup(t, root, podB)
	const podC = "77777777-2222-3333-4444-555555555555"
	maxC := podCgroup(t, root, podC)
	s := e.state()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	claim := builders.MakeClaim("ns", "shared").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
		{Resource: "pods", Name: "a", UID: podA},
		{Resource: "pods", Name: "b", UID: podB},
	}
	client := k8sfake.NewClientset(claim)
	d := &Driver{state: s, client: client, cfg: e.cfg}
	if _, err := s.PrepareFor(ctx, claim, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if err := d.watchPods(ctx); err != nil {
		t.Fatal(err)
	}
	pod := func(name, uid string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, UID: types.UID(uid)},
			Spec:       corev1.PodSpec{NodeName: node, ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("shared")}}},
		}
	}
	// Pod c names the claim in its spec (a tenant can), but the claim is not reserved for it.
	for _, p := range []*corev1.Pod{pod("c", podC), pod("b", podB)} {
		if _, err := client.CoreV1().Pods("ns").Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for readFile(t, maxB) != gpu0Region+" 10737418240\n" {
		if time.Now().After(deadline) {
			t.Fatalf("pod b's dmem.max %q", readFile(t, maxB))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := s.PreparedClaims()[string(claim.UID)].Pods; len(got) != 2 {
		t.Errorf("claim pods %+v", got)
	}
	if got := readFile(t, maxC); got != "" {
		t.Errorf("pod c, which the claim is not reserved for, got dmem.max %q", got)
	}
	if env := e.specEnv(string(claim.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=cgroup") {
		t.Errorf("both pods capped, env %v", env)
	}
}

// A pod that joins a prepared claim and cannot be capped turns the claim to mps-per-process:
// its CDI spec for containers started later, and its status.devices.
func TestCgroupCapPodJoiningUncappedTurnsClaimPerProcess(t *testing.T) {
	e := newEnv(t)
	root := e.cgroupRoot()
	podCgroup(t, root, podA)
	podCgroup(t, root, podB)
	bMax := filepath.Join(root, "kubepods", "burstable", "pod"+podB, "dmem.max")
	if err := os.Remove(bMax); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(bMax, 0o755); err != nil {
		t.Fatal(err)
	}
	s := e.state()
	ctx := context.Background()
	claim := builders.MakeClaim("ns", "shared").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{
		{Resource: "pods", Name: "a", UID: podA},
		{Resource: "pods", Name: "b", UID: podB},
	}
	client := k8sfake.NewClientset(claim)
	d := &Driver{state: s, client: client, cfg: e.cfg}
	s.caps.podEvent = func(context.Context, string, checkpoint.PodRef, string, string) {}
	published := make(chan string, 1)
	s.caps.capChanged = func(ctx context.Context, ns, name, uid string) {
		d.capChanged(ctx, ns, name, uid)
		published <- name
	}
	if _, err := s.PrepareFor(ctx, claim, []checkpoint.PodRef{{UID: podA, Name: "a"}}); err != nil {
		t.Fatal(err)
	}
	if env := e.specEnv(string(claim.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=cgroup") {
		t.Fatalf("pod a capped, env %v", env)
	}
	d.podSeen(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "b", UID: podB},
		Spec:       corev1.PodSpec{NodeName: node},
		Status:     corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("shared")}}},
	})
	if env := e.specEnv(string(claim.UID)); !slices.Contains(env, "FGPU_MEMORY_CAP=mps-per-process") {
		t.Errorf("pod b not capped, env %v", env)
	}
	select {
	case <-published:
	case <-time.After(5 * time.Second):
		t.Fatal("the claim's status was not republished")
	}
	got, err := client.ResourceV1().ResourceClaims("ns").Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Devices) != 1 || !strings.Contains(string(got.Status.Devices[0].Data.Raw), `"memoryCap":"mps-per-process"`) {
		t.Errorf("status.devices %+v", got.Status.Devices)
	}
}
