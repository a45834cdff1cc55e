package plugin

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	configapi "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/internal/testing/builders"
	"github.com/fgpu-dev/fgpu/pkg/checkpoint"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
)

var standIn string

// node is the plugin's node; the tests' claims are allocated on its gpu-0 unless they say.
const node = "node-a"

func TestMain(m *testing.M) {
	dir, _ := os.MkdirTemp("", "fgpu-standin")
	standIn = filepath.Join(dir, "fake-mps-control")
	if out, err := exec.Command("go", "build", "-o", standIn, "github.com/fgpu-dev/fgpu/cmd/fake-mps-control").CombinedOutput(); err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type env struct {
	t   testing.TB
	cfg Config
	// client is what a restarted plugin rebuilds a corrupt checkpoint from; nil: no API.
	client kubernetes.Interface
}

func newEnv(t testing.TB) *env {
	if os.Geteuid() != 0 {
		t.Skip("fake device nodes need root")
	}
	// Not t.TempDir(): MPS pipe sockets need short paths.
	root, err := os.MkdirTemp("", "fgpu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	return &env{t: t, cfg: Config{
		DriverName: configapi.DriverName, NodeName: node,
		CDIDir: filepath.Join(root, "cdi"), PluginDataDir: filepath.Join(root, "plugin"),
		MPSRoot: filepath.Join(root, "mps"), DevRoot: filepath.Join(root, "dev"),
		ReservedMemory: 1 << 30,
	}}
}

// state builds a fresh State over the env's directories, as a restarted plugin would.
func (e *env) state() *State {
	e.t.Helper()
	s, err := NewState(context.Background(), e.cfg, e.backend(), e.client)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		keys, _ := s.daemons.mps.Keys(context.Background())
		for _, k := range keys {
			if err := s.daemons.mps.Stop(context.Background(), k); err != nil {
				e.t.Error(err)
			}
		}
	})
	return s
}

func (e *env) backend() *fake.Backend {
	e.t.Helper()
	fleet, _ := fake.ParseSpec("2xH100-80GB")
	b, err := fake.New(fleet, node, e.cfg.DevRoot, standIn)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) specEnv(uid string) []string {
	e.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	var out []string
	for _, name := range cache.ListDevices() {
		if strings.Contains(name, uid) {
			out = append(out, cache.GetDevice(name).ContainerEdits.Env...)
		}
	}
	return out
}

func (e *env) specCount() int {
	entries, _ := os.ReadDir(e.cfg.CDIDir)
	return len(entries)
}

func TestThreeClaimsShareOneGPUThroughOneMPSServer(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	uids := map[string]string{}
	for _, c := range []struct{ name, mem string }{{"a", "10Gi"}, {"b", "20Gi"}, {"c", "30Gi"}} {
		claim := builders.MakeClaim("ns", c.name).Memory(c.mem).Compute("20").AllocatedOn(node, "gpu-0").Obj()
		uids[c.name] = string(claim.UID)
		devs, err := s.Prepare(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 1 || *devs[0].ShareID != *claim.Status.Allocation.Devices.Results[0].ShareID || len(devs[0].CDIDeviceIDs) != 1 {
			t.Fatalf("devices %+v", devs)
		}
	}
	envA := e.specEnv(uids["a"])
	for _, want := range []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "FGPU_MEMORY_LIMIT=10Gi", "FGPU_SHARING_MODE=mps"} {
		if !slices.Contains(envA, want) {
			t.Errorf("claim a's spec lacks %s: %v", want, envA)
		}
	}
	pipeOf := func(env []string) string {
		for _, v := range env {
			if p, ok := strings.CutPrefix(v, "CUDA_MPS_PIPE_DIRECTORY="); ok {
				return p
			}
		}
		return ""
	}
	if pa, pc := pipeOf(envA), pipeOf(e.specEnv(uids["c"])); pa == "" || pa != pc {
		t.Fatalf("claims of one domain on one GPU must share the MPS pipe directory: %q vs %q", pa, pc)
	}
	keys, _ := s.daemons.mps.Keys(context.Background())
	if len(keys) != 1 {
		t.Fatalf("want one MPS daemon, have %v", keys)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeExclusiveProcess {
		t.Fatalf("a GPU owned by one MPS server should be EXCLUSIVE_PROCESS, got %s", m)
	}
	st, err := fakecontrol.ReadState(s.daemons.mps.LogDir(keys[0]))
	if err != nil || st.DefaultPinnedMemLimit["0"] != "30720M" {
		t.Fatalf("server default should be the largest tenant cap (30Gi): %+v %v", st, err)
	}
}

func TestIsolationDomainsGetSeparateServers(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("a", "x").Memory("10Gi").Config(map[string]any{"isolationDomain": "team-a"}).AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(ctx, builders.MakeClaim("b", "y").Memory("10Gi").Config(map[string]any{"isolationDomain": "team-b"}).AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	keys, _ := s.daemons.mps.Keys(context.Background())
	if len(keys) != 2 {
		t.Fatalf("two domains on one GPU need two MPS daemons, have %v", keys)
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("two MPS servers on one GPU need the default compute mode, got %s", m)
	}
}

// Two namespaces' claims with the same config never share an MPS server, pipe directory or
// shm, whatever domain the config names: in scheduler mode tenants write the config, and the
// plugin derives the daemon from the claim's namespace.
func TestNamespacesNeverShareAServer(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	claims := []*resourceapi.ResourceClaim{
		builders.MakeClaim("victim", "v").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj(),
		builders.MakeClaim("attacker", "same").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj(),
		builders.MakeClaim("attacker", "named").Memory("10Gi").Config(map[string]any{"isolationDomain": "victim"}).AllocatedOn(node, "gpu-0").Obj(),
		builders.MakeClaim("attacker", "ns").Memory("10Gi").Config(map[string]any{"isolationDomain": "ns-victim"}).AllocatedOn(node, "gpu-0").Obj(),
		builders.MakeClaim("victim", "v2").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj(),
	}
	dev := map[string]checkpoint.PreparedDevice{}
	for _, c := range claims {
		if _, err := s.Prepare(ctx, c); err != nil {
			t.Fatal(err)
		}
		dev[c.Namespace+"/"+c.Name] = s.cp.Claims[string(c.UID)].Devices[0]
	}
	v := dev["victim/v"]
	if v.IsolationDomain != "victim/default" || v.MPSKey == "" {
		t.Fatalf("victim's share %+v", v)
	}
	if dev["victim/v2"].MPSKey != v.MPSKey {
		t.Errorf("two claims of one namespace and domain got servers %s and %s", v.MPSKey, dev["victim/v2"].MPSKey)
	}
	for _, k := range []string{"attacker/same", "attacker/named", "attacker/ns"} {
		a := dev[k]
		if a.MPSKey == v.MPSKey || !strings.HasPrefix(a.IsolationDomain, "attacker/") {
			t.Errorf("%s shares the victim's server: %+v", k, a)
		}
		if s.daemons.mps.PipeDir(a.MPSKey) == s.daemons.mps.PipeDir(v.MPSKey) || s.daemons.mps.ShmDir(a.MPSKey) == s.daemons.mps.ShmDir(v.MPSKey) {
			t.Errorf("%s: the victim's pipe or shm directory", k)
		}
	}
	if dev["attacker/same"].MPSKey == dev["attacker/named"].MPSKey {
		t.Error("two sub-domains of one namespace share a server")
	}
	if !slices.Contains(e.specEnv(string(claims[0].UID)), "FGPU_ISOLATION_DOMAIN=victim/default") {
		t.Errorf("victim's env %v", e.specEnv(string(claims[0].UID)))
	}
}

// FGPU_MEMORY_ENFORCED is true only where nothing can pin more than the cap: a whole GPU,
// or MPS on a GPU the allocator keeps to this domain alone.
func TestMemoryEnforcedEnv(t *testing.T) {
	for name, tc := range map[string]struct {
		fenced bool
		claim  *builders.ClaimBuilder
		want   string
		why    string
	}{
		"scheduler mode mps": {false, builders.MakeClaim("ns", "c").Memory("10Gi"), "false", "in scheduler mode"},
		"scheduler mode mps with a placement the tenant wrote": {false, builders.MakeClaim("ns", "c").Memory("10Gi").Config(map[string]any{"placement": map[string]any{}}), "false", "in scheduler mode"},
		"allocator mode, GPU kept to the domain":               {true, builders.MakeClaim("ns", "c").Memory("10Gi").Config(map[string]any{"placement": map[string]any{}}), "true", "mps: caps each MPS client process, not the container as a whole; no other isolation domain can use this GPU"},
		"allocator mode, other domains may share":              {true, builders.MakeClaim("ns", "c").Memory("10Gi").Config(map[string]any{"placement": map[string]any{"allowSharedGPU": true}}), "false", "the placement lets other isolation domains use this GPU"},
		"allocator mode, no placement":                         {true, builders.MakeClaim("ns", "c").Memory("10Gi"), "false", "does not say the GPU is this isolation domain's alone"},
		"time-slicing":                                         {true, builders.MakeClaim("ns", "c").Memory("10Gi").Config(map[string]any{"mode": "timeSlicing", "placement": map[string]any{}}), "false", "time-slicing: no memory cap"},
		"whole GPU, scheduler mode":                            {false, builders.MakeClaim("ns", "c").Class(configapi.DeviceClassExclusive), "true", "exclusive: the claim holds the whole GPU"},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			e.cfg.Fenced = tc.fenced
			s := e.state()
			claim := tc.claim.AllocatedOn(node, "gpu-0").Obj()
			if _, err := s.Prepare(context.Background(), claim); err != nil {
				t.Fatal(err)
			}
			env := e.specEnv(string(claim.UID))
			if !slices.Contains(env, "FGPU_MEMORY_ENFORCED="+tc.want) || !slices.Contains(env, "FGPU_MEMORY_ENFORCED_0="+tc.want) {
				t.Errorf("want FGPU_MEMORY_ENFORCED=%s: %v", tc.want, env)
			}
			var why string
			for _, v := range env {
				if w, ok := strings.CutPrefix(v, "FGPU_MEMORY_ENFORCEMENT="); ok {
					why = w
				}
			}
			if !strings.Contains(why, tc.why) {
				t.Errorf("FGPU_MEMORY_ENFORCEMENT=%q, want it to say %q", why, tc.why)
			}
			p := s.cp.Claims[string(claim.UID)].Devices[0]
			if strconv.FormatBool(p.MemoryEnforced) != tc.want || p.MemoryEnforcement != why {
				t.Errorf("checkpoint (status source) says %v %q", p.MemoryEnforced, p.MemoryEnforcement)
			}
		})
	}
}

func computeMode(t *testing.T, s *State, device string) gpu.ComputeMode {
	devs, err := s.backend.Devices()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Name() == device {
			return d.ComputeMode
		}
	}
	t.Fatalf("no %s", device)
	return ""
}

func TestPrepareRefusesOverCommit(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	if _, err := s.Prepare(ctx, builders.MakeClaim("ns", "a").Memory("60Gi").Compute("70").AllocatedOn(node, "gpu-0").Obj()); err != nil {
		t.Fatal(err)
	}
	_, err := s.Prepare(ctx, builders.MakeClaim("ns", "b").Memory("20Gi").AllocatedOn(node, "gpu-0").Obj())
	if err == nil || !strings.Contains(err.Error(), "refusing to over-commit GPU gpu-0") || !strings.Contains(err.Error(), "asks 20Gi memory, 60Gi of 79Gi") {
		t.Fatalf("memory over-commit: %v", err)
	}
	_, err = s.Prepare(ctx, builders.MakeClaim("ns", "c").Memory("1Gi").Compute("40").AllocatedOn(node, "gpu-0").Obj())
	if err == nil || !strings.Contains(err.Error(), "asks 40% compute, 70% of 100%") {
		t.Fatalf("compute over-commit: %v", err)
	}
	if e.specCount() != 1 {
		t.Fatalf("refused claims left specs: %d", e.specCount())
	}
}

func TestBadConfigLeavesNothingBehind(t *testing.T) {
	for name, tc := range map[string]struct {
		claim string
		cfg   map[string]any
		want  string
	}{
		"unknown mode":       {"10Gi", map[string]any{"mode": "vgpu"}, `unknown sharing mode "vgpu"`},
		"memory above":       {"10Gi", map[string]any{"memoryLimit": "90Gi"}, "memoryLimit 90Gi is above the 10Gi allocated to the claim (GPU gpu-0 has 79Gi allocatable)"},
		"negative compute":   {"10Gi", map[string]any{"computePercent": -5}, "computePercent -5 must be between 1 and 100"},
		"unknown field":      {"10Gi", map[string]any{"memory": "1Gi"}, `unknown field "memory"`},
		"device not on node": {"", nil, `allocated device "gpu-7" does not exist`},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			s := e.state()
			b, dev := builders.MakeClaim("ns", "bad").Memory("10Gi"), "gpu-0"
			if tc.cfg != nil {
				b.Config(tc.cfg)
			} else {
				dev = "gpu-7"
			}
			_, err := s.Prepare(context.Background(), b.AllocatedOn(node, dev).Obj())
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
			keys, _ := s.daemons.mps.Keys(context.Background())
			if e.specCount() != 0 || len(keys) != 0 || len(s.PreparedClaims()) != 0 {
				t.Fatalf("left behind: %d specs, daemons %v, %d entries", e.specCount(), keys, len(s.PreparedClaims()))
			}
		})
	}
}

func TestUnprepareStopsTheServerAfterTheLastTenant(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	a, b := builders.MakeClaim("ns", "a").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj(), builders.MakeClaim("ns", "b").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, a); err != nil {
		t.Fatal(err)
	}
	again, err := s.Prepare(ctx, a)
	if err != nil || len(again) != 1 {
		t.Fatalf("second prepare of the same claim: %v %v", again, err)
	}
	if _, err := s.Prepare(ctx, b); err != nil {
		t.Fatal(err)
	}
	key, _ := s.daemons.mps.Keys(context.Background())
	if err := s.Unprepare(ctx, string(a.UID)); err != nil {
		t.Fatal(err)
	}
	if !s.daemons.mps.Running(ctx, key[0]) {
		t.Fatal("daemon stopped while claim b still uses it")
	}
	if err := s.Unprepare(ctx, string(b.UID)); err != nil {
		t.Fatal(err)
	}
	if err := s.Unprepare(ctx, string(b.UID)); err != nil {
		t.Fatalf("unprepare is idempotent: %v", err)
	}
	keys, _ := s.daemons.mps.Keys(context.Background())
	if s.daemons.mps.Running(ctx, key[0]) || len(keys) != 0 || e.specCount() != 0 {
		t.Fatalf("left: daemons %v, %d specs", keys, e.specCount())
	}
	if m := computeMode(t, s, "gpu-0"); m != gpu.ComputeModeDefault {
		t.Fatalf("a GPU no MPS server owns should be back in the default mode, got %s", m)
	}
}

func TestWholeGPUNeedsNoMPS(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	whole := builders.MakeClaim("ns", "whole").Memory("79Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(context.Background(), whole); err != nil {
		t.Fatal(err)
	}
	env := e.specEnv(string(whole.UID))
	if !slices.Contains(env, "FGPU_SHARING_MODE=exclusive") || slices.ContainsFunc(env, func(v string) bool { return strings.HasPrefix(v, "CUDA_MPS_") }) {
		t.Fatalf("whole GPU env %v", env)
	}
	if keys, _ := s.daemons.mps.Keys(context.Background()); len(keys) != 0 {
		t.Fatalf("daemons %v", keys)
	}
}

// A plugin killed after the side effects but before Completed: the restart rolls back the
// half-prepared claim and keeps the completed one, with its daemon running again.
func TestRestartRecoversFromACrashMidPrepare(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	ctx := context.Background()
	done := builders.MakeClaim("ns", "done").Memory("10Gi").AllocatedOn(node, "gpu-0").Obj()
	if _, err := s.Prepare(ctx, done); err != nil {
		t.Fatal(err)
	}
	half := builders.MakeClaim("ns", "half").Memory("10Gi").Config(map[string]any{"isolationDomain": "other"}).AllocatedOn(node, "gpu-0").Obj()
	planned, err := s.planner.plan(half)
	if err != nil {
		t.Fatal(err)
	}
	entry := &checkpoint.ClaimEntry{Namespace: "ns", Name: "half", State: checkpoint.PrepareStarted, Devices: planned}
	s.cp.Claims[string(half.UID)] = entry
	if err := s.store.Save(s.cp); err != nil {
		t.Fatal(err)
	}
	if err := s.apply(ctx, string(half.UID), entry, false); err != nil {
		t.Fatal(err)
	}
	// The crash also takes the daemons with it (they live in the plugin's container).
	keys, _ := s.daemons.mps.Keys(context.Background())
	for _, k := range keys {
		if err := s.daemons.mps.Stop(ctx, k); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(s.daemons.mps.PipeDir(k), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	orphan := []byte("cdiVersion: 0.5.0\nkind: fgpu.dev/gpu\ndevices: []\n")
	if err := os.WriteFile(filepath.Join(e.cfg.CDIDir, "fgpu.dev-gpu_orphan.yaml"), orphan, 0o644); err != nil {
		t.Fatal(err)
	}

	restarted := e.state()
	claims := restarted.PreparedClaims()
	if len(claims) != 1 || claims[string(done.UID)].State != checkpoint.PrepareCompleted {
		t.Fatalf("after restart: %+v", claims)
	}
	keys, _ = restarted.daemons.mps.Keys(context.Background())
	if len(keys) != 1 || !restarted.daemons.mps.Running(ctx, keys[0]) {
		t.Fatalf("want only the completed claim's daemon running, have %v", keys)
	}
	uids, _ := restarted.cdi.ClaimUIDs()
	if !slices.Equal(uids, []string{string(done.UID)}) {
		t.Fatalf("specs after restart: %v", uids)
	}
	if _, err := restarted.Prepare(ctx, half); err != nil {
		t.Fatalf("kubelet's retry must succeed: %v", err)
	}
}

// containerEnv is the environment a runtime gives a container that names the given CDI
// devices: all of them applied in one pass, as containerd does.
func (e *env) containerEnv(ids ...string) []string {
	e.t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(e.cfg.CDIDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatal(err)
	}
	return spec.Process.Env
}

func fgpuEnv(env []string) map[string]string {
	out := map[string]string{}
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "FGPU_") {
			out[k] = v
		}
	}
	return out
}

// twoDeviceClaim is a claim allocated gpu-0 and gpu-1 of the node, in that order, by two
// requests; shares names the memory of each (empty: the whole GPU).
func twoDeviceClaim(name string, mode configapi.SharingMode, shares ...string) *resourceapi.ResourceClaim {
	c := builders.MakeClaim("ns", name).Class(configapi.DeviceClassExclusive).Config(map[string]any{"mode": string(mode)}).AllocatedOn(node, "gpu-0").Obj()
	results := []resourceapi.DeviceRequestAllocationResult{}
	for i, mem := range shares {
		r := resourceapi.DeviceRequestAllocationResult{Request: fmt.Sprintf("gpu%d", i), Driver: configapi.DriverName, Pool: node, Device: fmt.Sprintf("gpu-%d", i)}
		if mem != "" {
			r.ShareID = ptr.To(types.UID(fmt.Sprintf("00000000-0000-4000-8000-00000000000%d", i)))
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{configapi.CapacityMemory: resource.MustParse(mem)}
		}
		results = append(results, r)
	}
	c.Status.Allocation.Devices.Results = results
	return c
}

// A container of a claim with two whole GPUs sees both, each under its own index, and no
// singular variable that names only one of them.
func TestTwoWholeGPUsAreBothVisible(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	claim := twoDeviceClaim("two", configapi.SharingModeMPS, "", "")
	devs, err := s.Prepare(context.Background(), claim)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	got := fgpuEnv(e.containerEnv(ids...))
	gpus := s.Devices()
	want := map[string]string{}
	for i, d := range gpus {
		for k, v := range map[string]string{
			"FGPU_GPU_UUID": d.UUID, "FGPU_DEVICE": d.Name(), "FGPU_SHARE_ID": "", "FGPU_SHARING_MODE": ModeExclusive,
			"FGPU_ISOLATION_DOMAIN": s.cp.Claims[string(claim.UID)].Devices[i].IsolationDomain, "FGPU_MEMORY_LIMIT_BYTES": "84825604096", "FGPU_MEMORY_LIMIT": "79Gi",
			"FGPU_MEMORY_GUARANTEED_BYTES": "84825604096", "FGPU_MEMORY_GUARANTEED": "79Gi",
			"FGPU_COMPUTE_PERCENT": "100", "FGPU_MEMORY_ENFORCED": "true", "FGPU_MEMORY_ENFORCEMENT": "exclusive: the claim holds the whole GPU",
			"FGPU_MEMORY_CAP": MemoryCapWholeGPU,
		} {
			want[fmt.Sprintf("%s_%d", k, i)] = v
		}
	}
	if !maps.Equal(got, want) {
		t.Fatalf("container env\n got %v\nwant %v", got, want)
	}

	// A container that names only the second request gets only the second GPU's variables.
	got = fgpuEnv(e.containerEnv(devs[1].CDIDeviceIDs...))
	if len(got) != 13 || got["FGPU_GPU_UUID_1"] != gpus[1].UUID || got["FGPU_DEVICE_1"] != "gpu-1" {
		t.Fatalf("env of a container of the second request: %v", got)
	}
}

// Time-sliced shares of two GPUs keep their own memory limits and share IDs.
func TestTimeSlicedSharesOfTwoGPUsKeepTheirOwnLimits(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	claim := twoDeviceClaim("sliced", configapi.SharingModeTimeSlicing, "10Gi", "20Gi")
	devs, err := s.Prepare(context.Background(), claim)
	if err != nil {
		t.Fatal(err)
	}
	got := fgpuEnv(e.containerEnv(append(devs[0].CDIDeviceIDs, devs[1].CDIDeviceIDs...)...))
	for k, v := range map[string]string{
		"FGPU_MEMORY_LIMIT_0": "10Gi", "FGPU_MEMORY_LIMIT_1": "20Gi",
		"FGPU_SHARE_ID_0": "00000000-0000-4000-8000-000000000000", "FGPU_SHARE_ID_1": "00000000-0000-4000-8000-000000000001",
		"FGPU_MEMORY_ENFORCED_0": "false", "FGPU_MEMORY_ENFORCED_1": "false",
	} {
		if got[k] != v {
			t.Errorf("%s=%q, want %q", k, got[k], v)
		}
	}
	if _, ok := got["FGPU_MEMORY_LIMIT"]; ok {
		t.Errorf("a claim of two devices has a singular FGPU_MEMORY_LIMIT: %v", got)
	}
}

// A claim of one device keeps the singular names it always had, and gets index 0 as well.
func TestOneDeviceClaimHasSingularAndIndexedNames(t *testing.T) {
	e := newEnv(t)
	s := e.state()
	claim := builders.MakeClaim("ns", "one").Memory("10Gi").AllocatedOn(node, "gpu-1").Obj()
	devs, err := s.Prepare(context.Background(), claim)
	if err != nil {
		t.Fatal(err)
	}
	got := fgpuEnv(e.containerEnv(devs[0].CDIDeviceIDs...))
	uuid := s.Devices()[1].UUID
	if got["FGPU_GPU_UUID"] != uuid || got["FGPU_GPU_UUID_0"] != uuid || got["FGPU_MEMORY_LIMIT"] != "10Gi" || got["FGPU_MEMORY_LIMIT_0"] != "10Gi" ||
		got["FGPU_MEMORY_GUARANTEED"] != "10Gi" || got["FGPU_MEMORY_GUARANTEED_BYTES_0"] != "10737418240" || len(got) != 26 {
		t.Fatalf("env %v", got)
	}
}
