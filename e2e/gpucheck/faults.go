package main

// The faults check (faults.sh; docs/faults.md, "The check on a GPU"): what a client's fatal
// fault does to an MPS server and its other clients, and what the plugin's own code makes of
// it. Two claims of one namespace share one MPS daemon on GPU 0, started as the check starts
// every daemon (hostLauncher). For the whole run the plugin's health watch (the backend's
// gpu.HealthMonitor) and its MPS check (plugin.State.CheckMPS) are polled, beside the
// daemon's own get_server_list / get_server_status answers and, on a real GPU, every XID
// NVML raises. A quiet phase runs a normal workload, which must raise no fault; then client
// A makes an illegal memory access while client B works, a new client tries to join, A and B
// exit, and a new client must work again. Only check failures fail it: a false alarm, an
// application's XID taken as the GPU's, a server FAULT the plugin missed, a domain that does
// not recover, anything left behind. The rest is reported, under "SEEN:".

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/gpu"
	"github.com/fgpu-dev/fgpu/pkg/gpu/fake"
	"github.com/fgpu-dev/fgpu/pkg/mps"
	"github.com/fgpu-dev/fgpu/pkg/mps/fakecontrol"
	"github.com/fgpu-dev/fgpu/pkg/plugin"
)

// faultClaims share one MPS daemon (one namespace): A faults, B works beside it, new clients
// join as further processes of B's claim.
var faultClaims = []claim{
	{"a", "team-f", "10Gi", "00000000-0000-4000-8000-00000000000a"},
	{"b", "team-f", "10Gi", "00000000-0000-4000-8000-00000000000b"},
}

// fakeXID is what a fake GPU "raises" for client A: XID 31, the MMU fault an illegal address
// gives on a real one.
const fakeXID = 31

type faultsCheck struct {
	fake           bool
	quiet, poll    time.Duration
	state          *plugin.State
	cfg            plugin.Config
	mon            gpu.HealthMonitor
	devs           []gpu.Device
	mgr            mps.Manager // for its directory layout and control binary only
	key            string      // the daemon's key
	self, checkDir string
	tenantArgs     []string // flags of `gpucheck tenant` before the devices
	out            string

	mu      sync.Mutex
	start   time.Time
	tFault  time.Time // client A's launch: the origin of the fault phase's times
	health  []healthReading
	servers []serverReading
	xids    []xidEvent
}

type healthReading struct {
	t      time.Time
	faults map[string][]gpu.Fault
	errs   map[string]error
}

type serverReading struct {
	t       time.Time
	answers string // get_server_list and each server's get_server_status, in words
	pids    []int
	fault   bool   // a server answered FAULT
	plugin  string // what the plugin's MPS check says of the daemon ("" nothing)
}

type xidEvent struct {
	t    time.Time
	uuid string
	xid  uint64
}

// faults runs the check; OUTDIR gets each client's output.
func faults(ctx context.Context, o options, state *plugin.State, cfg plugin.Config, backend gpu.Backend, devs []gpu.Device, args []string) error {
	fs := flag.NewFlagSet("faults", flag.ContinueOnError)
	c := &faultsCheck{fake: strings.HasPrefix(o.gpus, "fake:"), state: state, cfg: cfg, devs: devs, start: time.Now()}
	fs.DurationVar(&c.quiet, "quiet", 2*time.Minute, "how long the normal workload runs while no fault may be reported")
	fs.DurationVar(&c.poll, "poll", plugin.DefaultHealthPoll, "how often the health watch and the MPS check are read (the plugin's default)")
	fs.StringVar(&c.checkDir, "check-dir", "", "the directory of the clients' scripts (e2e/gpucheck), bound at /check in the tenants")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 || c.checkDir == "" {
		return errors.New("usage: gpucheck [flags] faults --check-dir DIR [--quiet D] [--poll D] OUTDIR")
	}
	c.out = fs.Arg(0)
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return err
	}
	if r, ok := backend.(modeReporter); ok {
		backend = r.Backend
	}
	mon, ok := backend.(gpu.HealthMonitor)
	if !ok {
		return fmt.Errorf("backend %T has no health watch", backend)
	}
	c.mon = mon
	c.mgr = mps.Manager{Root: cfg.MPSRoot, Binary: backend.MPSControlBinary()}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	c.self = self
	c.tenantArgs = []string{"tenant", "--cdi-dir", cfg.CDIDir, "--bind", c.checkDir + ":/check"}
	if c.fake {
		c.tenantArgs = append(c.tenantArgs, "--bind", filepath.Join(filepath.Dir(self), "fake-mps-control")+":/usr/local/bin/fake-mps-control")
	}

	for _, cl := range faultClaims {
		if err := prepare(ctx, state, cfg, c.out, cl); err != nil {
			return err
		}
	}
	daemons, err := daemonPIDs(cfg)
	if err != nil {
		return err
	}
	if len(daemons) != 1 {
		return fmt.Errorf("claims of one namespace got %d MPS daemons, want 1: %v", len(daemons), daemons)
	}
	for k, pid := range daemons {
		c.key = k
		c.logf("MPS control daemon %s: PID %d", k, pid)
	}
	kernelBefore, kernelErr := kernelXIDLines()

	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() { defer close(watched); c.watch(watchCtx) }()
	stopXIDs := func() {}
	if !c.fake {
		stop, err := watchXIDs(func(uuid string, xid uint64) {
			c.mu.Lock()
			c.xids = append(c.xids, xidEvent{time.Now(), uuid, xid})
			c.mu.Unlock()
			c.logf("NVML event: XID %d on GPU %s (%s)", xid, uuid, xidClass(xid))
		})
		if err != nil {
			c.logf("the check's own XID watch: %v", err)
		} else {
			stopXIDs = stop
		}
	}

	var fails []string
	fail := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		c.logf("FAIL: %s", msg)
		fails = append(fails, msg)
	}
	r := c.run(ctx, fail)
	stopXIDs()
	stopWatch()
	<-watched

	var kernel string
	switch after, err := kernelXIDLines(); {
	case c.fake:
		kernel = "not read (fake GPUs)"
	case kernelErr != nil || err != nil:
		kernel = fmt.Sprintf("not readable (%v)", errors.Join(kernelErr, err))
	case len(after) > len(kernelBefore):
		kernel = strings.Join(after[len(kernelBefore):], " | ")
	default:
		kernel = "no Xid line"
	}

	c.logf("== unprepare")
	for uid := range state.PreparedClaims() {
		if err := state.Unprepare(ctx, uid); err != nil {
			fail("unprepare claim %s: %v", uid, err)
		}
	}
	left := leftovers(c.cfg, c.mgr.Root)
	if left != "" {
		fail("left behind: %s", left)
	}
	if fails = c.seen(r, kernel, left, fails); len(fails) > 0 {
		return fmt.Errorf("%d check(s) failed", len(fails))
	}
	return nil
}

// result is what the phases saw, for the SEEN block.
type result struct {
	quietStart, quietEnd time.Time
	aLine                string
	aFault               *line
	bLast                *line
	bErrors              []line
	bExit                string
	probeWhile           string
	clientsExited        time.Time
	recovered            string
}

// run drives the phases; a phase that cannot go on ends it, as a failure.
func (c *faultsCheck) run(ctx context.Context, fail func(string, ...any)) result {
	var r result
	c.logf("== quiet phase: a normal workload for %s; the health watch must report no fault", c.quiet)
	workload := []string{"python3", "/check/matmul.py"}
	if c.fake {
		workload = []string{"/bin/sh", "/check/fake-tenant.sh"}
	}
	r.quietStart = time.Now()
	var quiet []*client
	for _, cl := range faultClaims {
		w, err := c.client(ctx, "quiet-"+cl.name, cl.name, append(workload, "quiet-"+cl.name)...)
		if err != nil {
			fail("start the quiet workload: %v", err)
			return r
		}
		quiet = append(quiet, w)
	}
	select {
	case <-time.After(c.quiet):
	case <-ctx.Done():
		return r
	}
	for _, w := range quiet {
		w.closeStdin()
	}
	for _, w := range quiet {
		if err := w.exit(2 * time.Minute); err != nil {
			fail("the normal workload %s: %v (its output: %s)", w.name, err, w.tail())
		}
	}
	r.quietEnd = time.Now()

	c.logf("== fault phase: client B works; client A makes an illegal memory access")
	b, err := c.client(ctx, "B", "b", c.clientCmd("loop")...)
	if err != nil {
		fail("start client B: %v", err)
		return r
	}
	defer b.kill()
	if _, ok := b.wait("ok", time.Minute); !ok {
		fail("client B did no CUDA work: %s", b.tail())
		return r
	}
	a, err := c.client(ctx, "A", "a", c.clientCmd("illegal")...)
	if err != nil {
		fail("start client A: %v", err)
		return r
	}
	defer a.kill()
	launch, ok := a.wait("launch", time.Minute)
	if !ok {
		fail("client A did not launch its kernel: %s", a.tail())
		return r
	}
	c.mu.Lock()
	c.tFault = launch.t
	c.mu.Unlock()
	if c.fake {
		// What NVIDIA's driver and server do on a real GPU: the GPU raises an XID, and the
		// server goes into FAULT.
		if err := fake.InjectFault(c.cfg.DevRoot, 0, fmt.Sprintf("xid %d client A's illegal address (stand-in)", fakeXID)); err != nil {
			fail("inject the fake XID: %v", err)
		}
		if err := os.WriteFile(filepath.Join(c.mgr.LogDir(c.key), fakecontrol.FaultFile), nil, 0o644); err != nil {
			fail("put the stand-in server into FAULT: %v", err)
		}
	}
	if l, ok := a.waitAny([]string{"fault", "nofault", "error"}, time.Minute); ok {
		r.aLine = l.detail
		if l.event == "fault" {
			r.aFault = &l
		}
	} else {
		r.aLine = "no answer within 1m: " + a.tail()
	}
	if r.aFault == nil {
		fail("client A did not fault: %s", r.aLine)
	}
	// Long enough for the plugin's MPS check to ask a few times, and for B to try again.
	c.sleep(ctx, max(5*c.poll, 2*time.Second))

	c.logf("== a new client while A and B live")
	r.probeWhile = c.probe(ctx)

	c.logf("== A and B exit")
	a.closeStdin()
	b.closeStdin()
	for _, cl := range []*client{a, b} {
		if err := cl.exit(30 * time.Second); err != nil {
			c.logf("client %s: %v", cl.name, err)
			if cl == b {
				r.bExit = err.Error()
			}
		}
	}
	r.clientsExited = time.Now()
	if c.fake {
		// The stand-in server recovers once its clients exited, as NVIDIA's does; the fake
		// GPU's XID line goes with them.
		if err := os.Remove(filepath.Join(c.mgr.LogDir(c.key), fakecontrol.FaultFile)); err != nil {
			fail("take the stand-in server out of FAULT: %v", err)
		}
		if err := fake.RemoveFaults(c.cfg.DevRoot, 0); err != nil {
			fail("remove the fake XID: %v", err)
		}
	}
	r.bLast, r.bErrors = b.lastOKAndErrors(launch.t)

	c.logf("== after A and B exited, a new client must work again")
	deadline := time.Now().Add(max(30*c.poll, 10*time.Second))
	for {
		c.sleep(ctx, c.poll)
		if s := c.lastServers(); s.fault || s.plugin != "" {
			if time.Now().After(deadline) {
				fail("the domain did not recover after its clients exited: %s; plugin: %s", s.answers, s.plugin)
				break
			}
			continue
		}
		p := c.probe(ctx)
		if strings.HasPrefix(p, "worked") {
			r.recovered = p
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			fail("no new client works after A and B exited: %s", p)
			break
		}
	}
	return r
}

func (c *faultsCheck) clientCmd(mode string) []string {
	if c.fake {
		return []string{"/bin/sh", "/check/fake-client.sh", mode}
	}
	return []string{"python3", "/check/cuda_client.py", mode}
}

// probe runs a new client as a further process of B's claim and says how it went.
func (c *faultsCheck) probe(ctx context.Context) string {
	p, err := c.client(ctx, "new", "b", c.clientCmd("probe")...)
	if err != nil {
		return "not started: " + err.Error()
	}
	p.closeStdin()
	timeout := max(15*c.poll, 5*time.Second)
	err = p.exit(timeout)
	out := p.tail()
	switch {
	case err == nil:
		return fmt.Sprintf("worked at %s: %s", c.rel(time.Now()), out)
	case errors.Is(err, errKilled):
		return fmt.Sprintf("hung: no answer within %s, killed (%s)", timeout, out)
	}
	return fmt.Sprintf("refused at %s: %s", c.rel(time.Now()), out)
}

// watch reads the health watch and the MPS daemon every poll until ctx ends, logging each
// change.
func (c *faultsCheck) watch(ctx context.Context) {
	var lastHealth, lastServers string
	t := time.NewTicker(c.poll)
	defer t.Stop()
	for {
		faults, errs := c.mon.Faults()
		h := healthReading{time.Now(), faults, errs}
		if s := describeHealth(h, c.devs); s != lastHealth {
			c.logf("health watch: %s", s)
			lastHealth = s
		}
		s := c.readServers(ctx)
		if ctx.Err() != nil {
			return
		}
		if d := s.answers + " | plugin's MPS check: " + or(s.plugin, "no fault"); d != lastServers {
			c.logf("MPS daemon: %s", d)
			lastServers = d
		}
		c.mu.Lock()
		c.health = append(c.health, h)
		c.servers = append(c.servers, s)
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// readServers asks the daemon itself, then the plugin's MPS check.
func (c *faultsCheck) readServers(ctx context.Context) serverReading {
	s := serverReading{t: time.Now()}
	list, err := c.control(ctx, "get_server_list")
	if err != nil {
		s.answers = fmt.Sprintf("get_server_list: %v: %s", err, list)
	} else {
		parts := []string{"get_server_list: " + or(strings.Join(strings.Fields(list), " "), "(none)")}
		for _, f := range strings.Fields(list) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				continue
			}
			s.pids = append(s.pids, pid)
			st, err := c.control(ctx, "get_server_status "+f)
			if err != nil {
				st = fmt.Sprintf("%v: %s", err, st)
			}
			s.fault = s.fault || strings.EqualFold(st, "FAULT")
			parts = append(parts, fmt.Sprintf("get_server_status %s: %s", f, st))
		}
		s.answers = strings.Join(parts, "; ")
	}
	for _, f := range c.state.CheckMPS(ctx) {
		if f.Key != c.key {
			continue
		}
		var claims []string
		for _, cl := range f.Claims {
			claims = append(claims, cl.Name)
		}
		s.plugin = fmt.Sprintf("%s; would evict the pods of claims %s", f.Message, strings.Join(claims, ", "))
	}
	return s
}

func (c *faultsCheck) control(ctx context.Context, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.mgr.Binary)
	cmd.Env = append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+c.mgr.PipeDir(c.key), "CUDA_MPS_LOG_DIRECTORY="+c.mgr.LogDir(c.key))
	cmd.Stdin = strings.NewReader(command + "\n")
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// describeHealth is one reading in words, with what the plugin makes of each fault.
func describeHealth(h healthReading, devs []gpu.Device) string {
	var parts []string
	if err := h.errs[""]; err != nil {
		parts = append(parts, "events: "+err.Error())
	}
	for _, d := range devs {
		if err := h.errs[d.UUID]; err != nil {
			parts = append(parts, fmt.Sprintf("%s unreadable: %v", d.Name(), err))
		}
		for _, f := range h.faults[d.UUID] {
			parts = append(parts, fmt.Sprintf("%s %s: %s", d.Name(), f, faultClass(f)))
		}
	}
	if len(parts) == 0 {
		return "no fault"
	}
	return strings.Join(parts, "; ")
}

// faultClass is what the plugin makes of a fault (pkg/gpu/health.go's table).
func faultClass(f gpu.Fault) string {
	if f.Kind == gpu.FaultXID && gpu.ApplicationXID(f.XID) {
		return "an application's XID: taints nothing"
	}
	if f.Severity() == gpu.SeverityFatal {
		return "the GPU's, fatal: taints it " + api.FaultTaintKey + ":NoExecute"
	}
	return "the GPU's, degraded: taints it " + api.DegradedTaintKey + ":NoSchedule"
}

func xidClass(xid uint64) string {
	return faultClass(gpu.Fault{Kind: gpu.FaultXID, XID: xid})
}

// tainting lists the readings within [from, to) whose faults the plugin would taint a GPU for:
// an application's XID never; a thermal or power slowdown, as the plugin damps them, only once
// plugin.SlowdownPolls readings in a row saw it (the check reads as often as the plugin).
func (c *faultsCheck) tainting(from, to time.Time) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	seen := map[string]bool{}
	streak := map[string]int{}
	for _, h := range c.health {
		if h.t.Before(from) || !h.t.Before(to) {
			continue
		}
		present := map[string]bool{}
		for _, d := range c.devs {
			for _, f := range h.faults[d.UUID] {
				what := d.Name() + " " + f.String()
				present[what] = true
				if f.Kind == gpu.FaultXID && gpu.ApplicationXID(f.XID) {
					continue
				}
				if f.Kind == gpu.FaultThermal || f.Kind == gpu.FaultPower {
					if streak[what]++; streak[what] < plugin.SlowdownPolls {
						continue
					}
				}
				if !seen[what] {
					seen[what] = true
					out = append(out, fmt.Sprintf("%s from %s", what, c.relLocked(h.t)))
				}
			}
		}
		for what := range streak {
			if !present[what] {
				delete(streak, what)
			}
		}
	}
	return out
}

func (c *faultsCheck) lastServers() serverReading {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.servers) == 0 {
		return serverReading{}
	}
	return c.servers[len(c.servers)-1]
}

// seen prints the summary, and returns the failures with those of its verdicts.
func (c *faultsCheck) seen(r result, kernel, left string, fails []string) []string {
	c.mu.Lock()
	health, servers, xids := slices.Clone(c.health), slices.Clone(c.servers), slices.Clone(c.xids)
	c.mu.Unlock()
	row := func(name, format string, a ...any) { fmt.Printf("  %-17s %s\n", name+":", fmt.Sprintf(format, a...)) }
	fmt.Println("SEEN:")
	events := "XID and ECC events watched"
	for _, h := range health {
		if err := h.errs[""]; err != nil {
			events = "events NOT watched: " + err.Error()
			break
		}
	}
	if c.fake {
		events = "fake GPUs: their fault files"
	}
	row("health watch", "%d readings, one every %s, over %s; %s", len(health), c.poll, time.Since(c.start).Round(time.Second), events)
	if !r.quietEnd.IsZero() {
		if t := c.tainting(r.quietStart, r.quietEnd); len(t) > 0 {
			row("quiet phase", "FAIL: a false alarm during %s of normal work: %s", r.quietEnd.Sub(r.quietStart).Round(time.Second), strings.Join(t, "; "))
			fails = append(fails, "false alarm")
		} else {
			row("quiet phase", "%s of normal work: no fault reported (ok)", r.quietEnd.Sub(r.quietStart).Round(time.Second))
		}
	}
	if r.aLine != "" {
		fails = c.seenFault(r, kernel, health, servers, xids, row, fails)
	}
	row("left behind", "%s", or(left, "nothing (ok)"))
	if len(fails) > 0 {
		row("result", "FAIL: %s", strings.Join(fails, "; "))
	} else {
		row("result", "ok")
	}
	return fails
}

// seenFault is the fault phase's part of the summary.
func (c *faultsCheck) seenFault(r result, kernel string, health []healthReading, servers []serverReading, xids []xidEvent,
	row func(name, format string, a ...any), fails []string) []string {
	aAt := ""
	if r.aFault != nil {
		aAt = " at " + c.rel(r.aFault.t)
	}
	row("client A", "launched its kernel at +0.000s; %s%s", r.aLine, aAt)
	var xs []string
	for _, x := range xids {
		xs = append(xs, fmt.Sprintf("XID %d at %s (NVML event; %s)", x.xid, c.rel(x.t), xidClass(x.xid)))
	}
	seenXID := map[string]bool{}
	for _, h := range health {
		for _, d := range c.devs {
			for _, f := range h.faults[d.UUID] {
				if f.Kind == gpu.FaultXID && !seenXID[f.Reason()] {
					seenXID[f.Reason()] = true
					xs = append(xs, fmt.Sprintf("%s from %s (health watch; %s)", f.Reason(), c.rel(h.t), faultClass(f)))
				}
			}
		}
	}
	row("XIDs", "%s", or(strings.Join(xs, "; "), "none seen"))
	row("kernel log", "%s", kernel)
	if t := c.tainting(c.tFault, time.Now()); len(t) > 0 {
		row("health verdict", "FAIL: the fault of an application taints the GPU: %s", strings.Join(t, "; "))
		fails = append(fails, "wrong classification")
	} else {
		row("health verdict", "from the fault on, nothing that taints the GPU (ok: an application's fault is not the GPU's)")
	}
	b := "no step after the launch"
	if r.bLast != nil {
		b = fmt.Sprintf("last good step at %s", c.rel(r.bLast.t))
	}
	if len(r.bErrors) > 0 {
		b += fmt.Sprintf("; %d failed steps, the first at %s: %s; the last: %s", len(r.bErrors), c.rel(r.bErrors[0].t), r.bErrors[0].detail, r.bErrors[len(r.bErrors)-1].detail)
	} else {
		b += "; none of its CUDA calls failed"
	}
	if r.bExit != "" {
		b += "; at exit: " + r.bExit
	}
	row("client B", "%s", b)
	var firstFault, lastFault, firstPlugin *serverReading
	for i, s := range servers {
		if s.t.Before(c.tFault) {
			continue
		}
		if s.fault {
			if firstFault == nil {
				firstFault = &servers[i]
			}
			lastFault = &servers[i]
			if s.plugin != "" && firstPlugin == nil {
				firstPlugin = &servers[i]
			}
		}
	}
	if firstFault == nil {
		row("MPS server", "never answered FAULT (servers: %s)", serverPIDs(servers))
	} else {
		row("MPS server", "FAULT from %s to %s (%s)", c.rel(firstFault.t), c.rel(lastFault.t), firstFault.answers)
	}
	var plugins []string
	for _, s := range servers {
		if s.plugin != "" && !slices.Contains(plugins, s.plugin) {
			plugins = append(plugins, s.plugin)
		}
	}
	switch {
	case firstFault != nil && firstPlugin == nil:
		row("plugin MPS check", "FAIL: the server answered FAULT, the plugin's MPS check did not report it")
		fails = append(fails, "plugin missed the server fault")
	case firstPlugin != nil:
		row("plugin MPS check", "reported it at %s (ok): %s", c.rel(firstPlugin.t), strings.Join(plugins, " / "))
	default:
		row("plugin MPS check", "%s", or(strings.Join(plugins, " / "), "reported no fault"))
	}
	row("new client", "while A and B lived: %s", r.probeWhile)
	if r.recovered != "" {
		row("recovery", "A and B exited by %s; a new client %s (ok); servers over the run: %s", c.rel(r.clientsExited), r.recovered, serverPIDs(servers))
	} else if !r.clientsExited.IsZero() {
		row("recovery", "FAIL: A and B exited by %s; no new client worked after", c.rel(r.clientsExited))
	}
	return fails
}

func serverPIDs(servers []serverReading) string {
	seen := map[int]bool{}
	for _, s := range servers {
		for _, p := range s.pids {
			seen[p] = true
		}
	}
	return or(fmt.Sprint(slices.Sorted(maps.Keys(seen))), "none")
}

// kernelXIDLines are the kernel log's Xid lines ("NVRM: Xid ...").
func kernelXIDLines() ([]string, error) {
	out, err := exec.Command("dmesg").Output()
	if err != nil {
		return nil, fmt.Errorf("dmesg: %w", err)
	}
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, "NVRM: Xid") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines, nil
}

// leftovers are the processes whose MPS pipe directory is under the MPS root (daemons,
// servers, clients), killed once named, and the mounts under the check's state.
func leftovers(cfg plugin.Config, mpsRoot string) string {
	var left []string
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		env, err := os.ReadFile(filepath.Join(p, "environ"))
		if err != nil || !strings.Contains(string(env), "CUDA_MPS_PIPE_DIRECTORY="+mpsRoot+"/") {
			continue
		}
		stat, _ := os.ReadFile(filepath.Join(p, "stat"))
		if _, rest, ok := strings.Cut(string(stat), ") "); ok && strings.HasPrefix(rest, "Z") {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join(p, "cmdline"))
		left = append(left, fmt.Sprintf("process %s (%s)", filepath.Base(p), strings.TrimSpace(strings.ReplaceAll(string(cmdline), "\x00", " "))))
		if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if mounts, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, l := range strings.Split(string(mounts), "\n") {
			for _, dir := range []string{mpsRoot, cfg.CDIDir, cfg.PluginDataDir} {
				if strings.Contains(l, " "+dir+"/") {
					left = append(left, "mount "+strings.Fields(l)[4])
				}
			}
		}
	}
	return strings.Join(left, "; ")
}

func (c *faultsCheck) logf(format string, a ...any) {
	now := time.Now()
	fmt.Printf("%s %s %s\n", now.Format("15:04:05.000"), c.rel(now), fmt.Sprintf(format, a...))
}

// rel is t relative to client A's launch once it happened, else to the check's start.
func (c *faultsCheck) rel(t time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.relLocked(t)
}

func (c *faultsCheck) relLocked(t time.Time) string {
	if c.tFault.IsZero() {
		return fmt.Sprintf("[start%+.3fs]", t.Sub(c.start).Seconds())
	}
	return fmt.Sprintf("%+.3fs", t.Sub(c.tFault).Seconds())
}

func (c *faultsCheck) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// line is one line a client printed: "<unix time> <event> <detail>", stamped when read.
type line struct {
	t             time.Time
	event, detail string
}

// client is a process in a tenant of one claim (`gpucheck tenant`), as a container of its pod.
type client struct {
	name  string
	cmd   *exec.Cmd
	stdin interface{ Close() error }
	done  chan struct{}

	mu    sync.Mutex
	lines []line
	err   error
}

var errKilled = errors.New("killed")

func (c *faultsCheck) client(ctx context.Context, name, claimName string, argv ...string) (*client, error) {
	devices, err := os.ReadFile(filepath.Join(c.out, "claim-"+claimName+".devices"))
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone(c.tenantArgs), "--devices", string(devices), "--")
	cmd := exec.CommandContext(ctx, c.self, append(args, argv...)...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w
	logFile, err := os.Create(filepath.Join(c.out, "client-"+name+".log"))
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		logFile.Close()
		return nil, err
	}
	w.Close()
	cl := &client{name: name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		defer logFile.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l := line{t: time.Now(), detail: sc.Text()}
			if f := strings.SplitN(sc.Text(), " ", 3); len(f) >= 2 {
				if _, err := strconv.ParseFloat(f[0], 64); err == nil {
					l.event, l.detail = f[1], strings.Join(f[2:], "")
				}
			}
			fmt.Fprintf(logFile, "%s %s\n", l.t.Format("15:04:05.000"), sc.Text())
			c.logf("%s: %s", name, sc.Text())
			cl.mu.Lock()
			cl.lines = append(cl.lines, l)
			cl.mu.Unlock()
		}
		r.Close()
		err := cmd.Wait()
		cl.mu.Lock()
		if cl.err == nil {
			cl.err = err
		}
		cl.mu.Unlock()
		close(cl.done)
	}()
	return cl, nil
}

func (cl *client) closeStdin() { _ = cl.stdin.Close() }

// exit waits for the client to exit, killing it after timeout; its error is its exit status.
func (cl *client) exit(timeout time.Duration) error {
	select {
	case <-cl.done:
	case <-time.After(timeout):
		cl.mu.Lock()
		cl.err = fmt.Errorf("no exit within %s: %w", timeout, errKilled)
		cl.mu.Unlock()
		cl.kill()
		<-cl.done
	}
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.err
}

// kill ends the tenant: its init dies with it (Pdeathsig), and with that its PID namespace.
func (cl *client) kill() {
	select {
	case <-cl.done:
	default:
		_ = cl.cmd.Process.Kill()
	}
}

func (cl *client) wait(event string, timeout time.Duration) (line, bool) {
	return cl.waitAny([]string{event}, timeout)
}

// waitAny waits for a line with one of the events; a client that exited has none to come.
func (cl *client) waitAny(events []string, timeout time.Duration) (line, bool) {
	deadline := time.Now().Add(timeout)
	for {
		exited := false
		select {
		case <-cl.done:
			exited = true
		default:
		}
		cl.mu.Lock()
		for _, l := range cl.lines {
			if slices.Contains(events, l.event) {
				cl.mu.Unlock()
				return l, true
			}
		}
		cl.mu.Unlock()
		if exited || time.Now().After(deadline) {
			return line{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// tail is the client's last lines, for messages.
func (cl *client) tail() string {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var out []string
	for _, l := range cl.lines[max(0, len(cl.lines)-3):] {
		out = append(out, strings.TrimSpace(l.event+" "+l.detail))
	}
	if cl.err != nil {
		out = append(out, "("+cl.err.Error()+")")
	}
	return or(strings.Join(out, " / "), "no output")
}

// lastOKAndErrors are the client's last good step before its first failed one from since
// on, and its failed steps from since on.
func (cl *client) lastOKAndErrors(since time.Time) (*line, []line) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	var last *line
	var errs []line
	for i, l := range cl.lines {
		switch {
		case l.event == "error" && !l.t.Before(since):
			errs = append(errs, l)
		case l.event == "ok" && len(errs) == 0:
			last = &cl.lines[i]
		}
	}
	return last, errs
}
