package main

// The usage check (`gpucheck usage`, run-usage.sh drives it): the kubelet plugin as its
// DaemonSet runs it (plugin.Start, over a fake API server with the node, the pods and the
// claims) measures two tenants of GPU 0 with its own usage meter, and every poll its
// per-claim figures (the metrics it serves) are compared with what the driver's own tool says
// of the tenants' processes: `nvidia-smi` on a real GPU, the fake GPU's usage file with fake
// GPUs. The summaries the plugin writes into the claims' status feed the allocator's
// recommender, whose size must be above each tenant's observed peak.
//
// The meter gives a process to a claim through the pod its cgroup names, as the kubelet makes
// them: each tenant is started in a cgroup named like its pod's, under a cgroup of this check.
// Where none can be made (no writable cgroup hierarchy), or this check itself runs in a pod's
// cgroup, the meter's other way is used and said: the FGPU_SHARE_ID the container received.

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
	"github.com/fgpu-dev/fgpu/pkg/sizing"
)

// usageTenant is one measured workload: its claim, its pod, and the pattern it plays.
type usageTenant struct {
	name, memory, share, podUID string
	// launcher is the `gpucheck tenant` process: the tenant's processes are it and its
	// descendants. exited is closed when it has exited.
	launcher *exec.Cmd
	exited   chan struct{}

	compared, agreed, moving int
	worstGap                 float64
	smCompared, smAgreed     int
	smiPeak, pluginPeak      int64
	smNote                   string
}

const usageNamespace = "usage"

func usageTenants() []*usageTenant {
	return []*usageTenant{
		{name: "steady", memory: "8Gi", share: "00000000-0000-4000-8000-0000000000a1", podUID: "5e1d0c8a-0000-4000-8000-0000000000a1"},
		{name: "ramp", memory: "14Gi", share: "00000000-0000-4000-8000-0000000000a2", podUID: "5e1d0c8a-0000-4000-8000-0000000000a2"},
	}
}

// ProcessUsage hands the plugin the NVML backend's measurement, which the wrapper would
// otherwise hide from it (the plugin measures only where its backend is a gpu.UsageSource).
func (m modeReporter) ProcessUsage(uuid string) ([]gpu.ProcessUsage, error) {
	source, ok := m.Backend.(gpu.UsageSource)
	if !ok {
		return nil, errors.New("the GPU backend measures no per-process use")
	}
	return source.ProcessUsage(uuid)
}

type usageOptions struct {
	duration, poll, report time.Duration
	minSamples             int
	hostPID                bool
	binds                  multiFlag
}

func usageCheck(o options, args []string) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	u := usageOptions{}
	fs.DurationVar(&u.duration, "duration", 3*time.Minute, "how long each tenant plays its pattern")
	fs.DurationVar(&u.poll, "poll", time.Second, "the plugin's usage poll (its default is 10s; shorter, so each comparison sees a fresh sample)")
	fs.DurationVar(&u.report, "report", 15*time.Second, "the plugin's report interval and heartbeat (5 and 30 min by default; shorter, so a short run is reported)")
	fs.IntVar(&u.minSamples, "min-samples", 60, "the recommender's minimum of samples (the allocator's default is an hour's)")
	fs.BoolVar(&u.hostPID, "host-pid", false, "tenants in the host's PID namespace (fake GPUs: the workload reports its use under its PID)")
	fs.Var(&u.binds, "bind", "passed to each tenant (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 2 {
		return errors.New("usage: gpucheck usage [flags] OUTDIR WORKLOAD... (run as WORKLOAD... NAME SECONDS)")
	}
	out, workload := fs.Arg(0), fs.Args()[1:]
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	cfg := o.config()
	cfg.RegistrarDir = filepath.Join(o.root, "registry")
	if err := os.MkdirAll(cfg.RegistrarDir, 0o755); err != nil {
		return err
	}
	cfg.UsagePoll, cfg.UsageReport, cfg.UsageHeartbeat = u.poll, u.report, u.report
	backend, err := o.backend(&cfg)
	if err != nil {
		return err
	}
	defer backend.Close()
	if _, ok := backend.(gpu.UsageSource); !ok {
		return errors.New("the GPU backend measures no per-process use: the plugin would not measure")
	}
	truth, err := newTruth(o, cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	tenants := usageTenants()
	cg, mapping := newPodCgroups(o.root)
	fmt.Println("mapping:", mapping)
	if cg != nil {
		defer cg.remove()
	}
	client := k8sfake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: cfg.NodeName, UID: "gpu-host-uid"}})
	var claims []*resourceapi.ResourceClaim
	for _, t := range tenants {
		pod, claim := usageObjects(cfg, t, cg == nil)
		if _, err := client.CoreV1().Pods(usageNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			return err
		}
		if _, err := client.ResourceV1().ResourceClaims(usageNamespace).Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			return err
		}
		claims = append(claims, claim)
	}
	reg := prometheus.NewRegistry()
	driver, err := plugin.Start(ctx, cfg, backend, client, plugin.NewMetrics(reg))
	if err != nil {
		return err
	}
	defer driver.Stop()
	results, err := driver.PrepareResourceClaims(ctx, claims)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	for _, t := range tenants {
		r := results[types.UID("uid-"+t.name)]
		if r.Err != nil {
			return fmt.Errorf("prepare claim %s: %w", t.name, r.Err)
		}
		ids := r.Devices[0].CDIDeviceIDs
		fmt.Printf("prepared claim %s (%s): CDI %v\n", t.name, t.memory, ids)
		targs := []string{"tenant", "--cdi-dir", cfg.CDIDir, "--devices", strings.Join(ids, ",")}
		if u.hostPID {
			targs = append(targs, "--host-pid")
		}
		for _, b := range u.binds {
			targs = append(targs, "--bind", b)
		}
		targs = append(append(append(targs, "--"), workload...), t.name, strconv.Itoa(int(u.duration.Seconds())))
		if err := t.start(exe, targs, cg, filepath.Join(out, "tenant-"+t.name+".log")); err != nil {
			return err
		}
	}
	defer func() {
		for _, t := range tenants {
			_ = t.launcher.Process.Kill()
			<-t.exited
		}
	}()

	opts := sizing.DefaultOptions()
	fmt.Printf("recommender: the allocator's defaults (memory p%.0f, compute p%.0f, %.0f%% headroom, %s half-life), min samples lowered from %d to %d so that a %s run recommends\n",
		opts.MemoryPercentile*100, opts.ComputePercentile*100, opts.Headroom*100, opts.HalfLife, opts.MinSamples, u.minSamples, u.duration)
	fmt.Printf("plugin: usage poll %s, report interval and heartbeat %s (shortened for the check)\n", u.poll, u.report)
	opts.MinSamples = u.minSamples
	rec := sizing.NewRecommender(opts)

	deadline := time.Now().Add(u.duration + 3*time.Minute)
	start := time.Now()
	for poll := 1; ; poll++ {
		if time.Now().After(deadline) {
			return fmt.Errorf("the tenants did not finish within %s", u.duration+3*time.Minute)
		}
		before, err := truth.read()
		if err != nil {
			return err
		}
		// Three polls and more: the plugin's newest sample was taken after the first reading,
		// even where its ticker runs late on a busy machine.
		time.Sleep(3*u.poll + 500*time.Millisecond)
		gauges, err := claimGauges(reg)
		if err != nil {
			return err
		}
		after, err := truth.read()
		if err != nil {
			return err
		}
		sm := truth.sm()
		if !allRunning(tenants) {
			break // their last samples are of processes going away: not compared, not fed
		}
		var line []string
		for _, t := range tenants {
			line = append(line, t.compare(before, after, gauges, sm))
		}
		fmt.Printf("poll %d t=%.0fs %s\n", poll, time.Since(start).Seconds(), strings.Join(line, " | "))
		feed(ctx, client, rec, tenants)
	}
	for _, t := range tenants {
		if err := t.wait(); err != nil {
			return fmt.Errorf("tenant %s: %w (see tenant-%s.log)", t.name, err, t.name)
		}
	}
	unprep := make([]kubeletplugin.NamespacedObject, 0, len(claims))
	for _, c := range claims {
		unprep = append(unprep, kubeletplugin.NamespacedObject{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}, UID: c.UID})
	}
	res, err := driver.UnprepareResourceClaims(ctx, unprep)
	if err == nil {
		for _, e := range res {
			err = errors.Join(err, e)
		}
	}
	if err != nil {
		return fmt.Errorf("unprepare: %w", err)
	}
	return verdict(tenants, rec, truth.note(), mapping)
}

// verdict prints the SEEN block and fails on what a user would call wrong.
func verdict(tenants []*usageTenant, rec *sizing.Recommender, smNote, mapping string) error {
	var failures []error
	fmt.Println("SEEN: mapping of processes to claims:", mapping)
	for _, t := range tenants {
		fmt.Printf("SEEN: %s: memory compared in %d polls (%d more skipped: the workload moved between the two readings), within 10%% in %d, largest gap %.1f%%; peak: plugin %s, %s\n",
			t.name, t.compared, t.moving, t.agreed, 100*t.worstGap, gib(t.pluginPeak), truthName(smNote, gib(t.smiPeak)))
		if t.compared < 3 {
			failures = append(failures, fmt.Errorf("%s: memory compared in only %d polls", t.name, t.compared))
		} else if t.agreed < t.compared {
			failures = append(failures, fmt.Errorf("%s: the plugin's memory was more than 10%% off in %d of %d polls", t.name, t.compared-t.agreed, t.compared))
		}
		switch {
		case t.compared == 0:
			fmt.Printf("SEEN: %s: SM activity not compared: no poll compared its memory\n", t.name)
		case t.smCompared > 0:
			fmt.Printf("SEEN: %s: SM activity compared in %d polls, within 10 points in %d (not a failure: the two average over different spans)\n", t.name, t.smCompared, t.smAgreed)
		default:
			fmt.Printf("SEEN: %s: SM activity not compared: %s\n", t.name, t.smNote)
		}
		w := usageWorkload(t)
		r, ok := rec.Recommend(w)
		if !ok {
			failures = append(failures, fmt.Errorf("%s: no recommendation", t.name))
			fmt.Printf("SEEN: %s: no recommendation\n", t.name)
			continue
		}
		verdict := "above the observed peak: ok"
		if r.MemoryBytes <= t.smiPeak {
			verdict = "NOT above the observed peak"
			failures = append(failures, fmt.Errorf("%s: recommended %s, not above its observed peak %s", t.name, gib(r.MemoryBytes), gib(t.smiPeak)))
		}
		fmt.Printf("SEEN: %s: recommended memory %s, compute %d%%, from %d samples (measured peak %s): %s\n",
			t.name, gib(r.MemoryBytes), r.ComputePercent, r.Samples, gib(r.PeakBytes), verdict)
	}
	return errors.Join(failures...)
}

func truthName(smNote, v string) string {
	if smNote == "" {
		return "nvidia-smi " + v
	}
	return smNote + " " + v
}

func gib(b int64) string { return fmt.Sprintf("%.2fGiB", float64(b)/(1<<30)) }

func usageWorkload(t *usageTenant) api.SizingWorkload {
	return api.SizingWorkload{Namespace: usageNamespace, Kind: "Pod", Name: "pod-" + t.name, Request: "gpu"}
}

// usageObjects are the tenant's pod and its claim, allocated on GPU 0 and reserved for the
// pod, as the scheduler leaves them. Without pod cgroups both claims are the one pod's
// this check runs in, or no running pod's at all.
func usageObjects(cfg plugin.Config, t *usageTenant, noCgroups bool) (*corev1.Pod, *resourceapi.ResourceClaim) {
	podUID := types.UID(t.podUID)
	if noCgroups {
		if own := ownPodUID(); own != "" {
			podUID = types.UID(own)
		}
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: usageNamespace, Name: "pod-" + t.name, UID: podUID},
		Spec:       corev1.PodSpec{NodeName: cfg.NodeName},
	}
	share := types.UID(t.share)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: usageNamespace, Name: "claim-" + t.name, UID: types.UID("uid-" + t.name)},
		Status: resourceapi.ResourceClaimStatus{
			Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
				Results: []resourceapi.DeviceRequestAllocationResult{{
					Request: "gpu", Driver: cfg.DriverName, Pool: cfg.NodeName, Device: "gpu-0", ShareID: &share,
					ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{api.CapacityMemory: resource.MustParse(t.memory)},
				}},
			}},
			ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: podUID}},
		},
	}
	return pod, claim
}

// feed gives the recommender the summaries the plugin wrote into the claims' status, as the
// allocator takes them from its watch (a summary seen twice counts once).
func feed(ctx context.Context, client *k8sfake.Clientset, rec *sizing.Recommender, tenants []*usageTenant) {
	for _, t := range tenants {
		c, err := client.ResourceV1().ResourceClaims(usageNamespace).Get(ctx, "claim-"+t.name, metav1.GetOptions{})
		if err != nil {
			continue
		}
		for _, st := range c.Status.Devices {
			var data api.DeviceStatusData
			if st.Data == nil || st.ShareID == nil || json.Unmarshal(st.Data.Raw, &data) != nil || data.Usage == nil {
				continue
			}
			if rec.Add(usageWorkload(t), *st.ShareID, *data.Usage) {
				fmt.Printf("  report of %s in its claim's status: %d samples, memory max %s p95 %s, SM p95 %d%%\n",
					t.name, data.Usage.Samples, gib(data.Usage.MemoryMaxBytes), gib(data.Usage.MemoryP95Bytes), data.Usage.SMP95Percent)
			}
		}
	}
}

// gaugeValues are the plugin's per-claim gauges: memory by claim, and SM by claim where the
// driver gave a sample.
type gaugeValues struct {
	memory map[string]int64
	sm     map[string]int
}

// claimGauges reads the plugin's per-claim gauges from its metrics registry.
func claimGauges(reg *prometheus.Registry) (gaugeValues, error) {
	// The gauges are reset and set again at every sample: a read in between misses them.
	for try := 0; ; try++ {
		g := gaugeValues{memory: map[string]int64{}, sm: map[string]int{}}
		families, err := reg.Gather()
		if err != nil {
			return g, err
		}
		for _, f := range families {
			for _, m := range f.GetMetric() {
				var claim string
				for _, l := range m.GetLabel() {
					if l.GetName() == "claim" {
						claim = l.GetValue()
					}
				}
				switch f.GetName() {
				case "fgpu_claim_memory_used_bytes":
					g.memory[claim] = int64(m.GetGauge().GetValue())
				case "fgpu_claim_sm_active_percent":
					g.sm[claim] = int(m.GetGauge().GetValue())
				}
			}
		}
		if len(g.memory) > 0 || try == 5 {
			return g, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// compare judges one poll for t: the plugin's memory against the truth's, when the truth did
// not move between its readings before and after the plugin's sample.
func (t *usageTenant) compare(before, after procUsage, g gaugeValues, sm map[int]int) string {
	pids := t.pids()
	b, a := before.memory(pids), after.memory(pids)
	t.smiPeak = max(t.smiPeak, b, a)
	got, ok := g.memory["claim-"+t.name]
	t.pluginPeak = max(t.pluginPeak, got)
	if a == 0 && b == 0 {
		return t.name + ": not on the GPU yet"
	}
	if !ok {
		return t.name + ": no figure from the plugin"
	}
	// Any step between the readings (a ramp's is a tenth of its use, near the end) leaves the
	// plugin's sample between two truths: not compared.
	if math.Abs(float64(a-b)) > 0.01*float64(max(a, b)) {
		t.moving++
		return fmt.Sprintf("%s: moving (truth %s -> %s), plugin %s", t.name, gib(b), gib(a), gib(got))
	}
	t.compared++
	gap := math.Abs(float64(got-a)) / float64(max(a, 1))
	t.worstGap = max(t.worstGap, gap)
	verdict := "ok"
	if gap <= 0.1 {
		t.agreed++
	} else {
		verdict = "OFF BY MORE THAN 10%"
	}
	s := fmt.Sprintf("%s: memory plugin %s truth %s %s", t.name, gib(got), gib(a), verdict)
	pluginSM, hasPlugin := g.sm["claim-"+t.name]
	truthSM, hasTruth := -1, false
	for _, p := range pids {
		if v, ok := sm[p]; ok && v >= 0 {
			truthSM, hasTruth = min(100, max(truthSM, 0)+v), true
		}
	}
	switch {
	case !hasPlugin:
		t.smNote = "the driver gave the plugin no per-process SM sample for it"
	case !hasTruth:
		t.smNote = "the truth gave no SM figure for its processes (nvidia-smi pmon shows none for MPS clients where the driver counts their SM time to the MPS server)"
	default:
		t.smCompared++
		if abs(pluginSM-truthSM) <= 10 {
			t.smAgreed++
		}
		s += fmt.Sprintf(", SM plugin %d%% truth %d%%", pluginSM, truthSM)
	}
	return s
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func (t *usageTenant) start(exe string, args []string, cg *podCgroups, logPath string) error {
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd := exec.Command(exe, args...)
	if cg != nil {
		procs, err := cg.create(t.podUID)
		if err != nil {
			return err
		}
		// The launcher joins its pod's cgroup before it starts anything, as runc puts a
		// container's first process in its cgroup.
		cmd = exec.Command("/bin/sh", append([]string{"-c", `echo 0 > "$0" && exec "$@"`, procs, exe}, args...)...)
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start tenant %s: %w", t.name, err)
	}
	t.launcher, t.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(t.exited) }()
	return nil
}

func allRunning(tenants []*usageTenant) bool {
	for _, t := range tenants {
		select {
		case <-t.exited:
			return false
		default:
		}
	}
	return true
}

func (t *usageTenant) wait() error {
	select {
	case <-t.exited:
	case <-time.After(2 * time.Minute):
		return errors.New("did not finish")
	}
	if !t.launcher.ProcessState.Success() {
		return fmt.Errorf("exited with %s", t.launcher.ProcessState)
	}
	return nil
}

// pids are the tenant's processes: its launcher and all its descendants, from /proc.
func (t *usageTenant) pids() []int {
	parent := map[int]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The command may hold spaces and parentheses: the fields follow its last ")".
		f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+1:]))
		if len(f) > 1 {
			parent[pid], _ = strconv.Atoi(f[1])
		}
	}
	out := []int{t.launcher.Process.Pid}
	for grew := true; grew; {
		grew = false
		for pid, pp := range parent {
			if slices.Contains(out, pp) && !slices.Contains(out, pid) {
				out = append(out, pid)
				grew = true
			}
		}
	}
	return out
}

// procUsage is the truth's memory per PID.
type procUsage map[int]int64

func (p procUsage) memory(pids []int) int64 {
	var sum int64
	for _, pid := range pids {
		sum += p[pid]
	}
	return sum
}

// truth is what the driver's own tool says of each process, independently of the plugin.
type truth struct {
	nvidiaSMI string
	usageFile string
}

func newTruth(o options, cfg plugin.Config) (*truth, error) {
	if strings.HasPrefix(o.gpus, "fake:") {
		return &truth{usageFile: fake.UsageFile(cfg.DevRoot, 0)}, nil
	}
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return nil, err
	}
	return &truth{nvidiaSMI: smi}, nil
}

// note names the truth where it is not nvidia-smi.
func (tr *truth) note() string {
	if tr.usageFile != "" {
		return "fake GPU usage file"
	}
	return ""
}

// read is each compute process's memory: `nvidia-smi --query-compute-apps`, or the fake
// GPU's usage file.
func (tr *truth) read() (procUsage, error) {
	if tr.usageFile != "" {
		out := procUsage{}
		rows, err := readUsageFile(tr.usageFile)
		for pid, r := range rows {
			out[pid] = r[0]
		}
		return out, err
	}
	raw, err := exec.Command(tr.nvidiaSMI, "-i", "0", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").Output()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi --query-compute-apps: %w", err)
	}
	return parseComputeApps(string(raw))
}

// parseComputeApps reads `nvidia-smi --query-compute-apps=pid,used_memory
// --format=csv,noheader,nounits` (MiB), summing a PID listed twice.
func parseComputeApps(raw string) (procUsage, error) {
	out := procUsage{}
	records, err := csv.NewReader(strings.NewReader(raw)).ReadAll()
	if err != nil {
		return nil, fmt.Errorf("nvidia-smi --query-compute-apps: %w", err)
	}
	for _, r := range records {
		if len(r) != 2 {
			continue
		}
		pid, err1 := strconv.Atoi(strings.TrimSpace(r[0]))
		mib, err2 := strconv.ParseInt(strings.TrimSpace(r[1]), 10, 64)
		if err1 == nil && err2 == nil {
			out[pid] += mib << 20
		}
	}
	return out, nil
}

// sm is each process's SM activity: `nvidia-smi pmon -c 1` (a "-" is no figure), or the
// fake GPU's usage file.
func (tr *truth) sm() map[int]int {
	out := map[int]int{}
	if tr.usageFile != "" {
		rows, _ := readUsageFile(tr.usageFile)
		for pid, r := range rows {
			out[pid] = int(r[1])
		}
		return out
	}
	raw, err := exec.Command(tr.nvidiaSMI, "pmon", "-i", "0", "-c", "1", "-s", "u").Output()
	if err != nil {
		fmt.Println("nvidia-smi pmon:", err)
		return out
	}
	return parsePmon(string(raw))
}

// parsePmon reads `nvidia-smi pmon -s u`: the "sm" column, found by the header whatever
// columns the driver adds; a "-" is no figure.
func parsePmon(raw string) map[int]int {
	out := map[int]int{}
	col := -1
	sc := bufio.NewScanner(strings.NewReader(raw))
	for sc.Scan() {
		f := strings.Fields(strings.TrimPrefix(sc.Text(), "#"))
		if strings.HasPrefix(sc.Text(), "#") {
			if i := slices.Index(f, "sm"); i >= 0 && slices.Contains(f, "pid") {
				col = i
			}
			continue
		}
		if col < 0 || len(f) <= col {
			continue
		}
		pid, err1 := strconv.Atoi(f[1])
		v, err2 := strconv.Atoi(f[col])
		if err1 == nil && err2 == nil {
			out[pid] = v
		}
	}
	return out
}

// readUsageFile reads the fake GPU's "PID MEMORY_BYTES SM_PERCENT" lines.
func readUsageFile(file string) (map[int][2]int64, error) {
	raw, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[int][2]int64{}
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		pid, err1 := strconv.Atoi(f[0])
		mem, err2 := strconv.ParseInt(f[1], 10, 64)
		sm, err3 := strconv.ParseInt(f[2], 10, 64)
		if errors.Join(err1, err2, err3) == nil {
			out[pid] = [2]int64{mem, sm}
		}
	}
	return out, nil
}
