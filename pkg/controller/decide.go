package controller

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/dynamic-resource-allocation/cel"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
	"github.com/fgpu-dev/fgpu/pkg/policy"
)

// wait is why a claim is not placed now.
type waitReason struct {
	reason  string // event reason
	message string
	quota   bool // blocked on quota: later claims of the namespace queue behind it
}

func (w *waitReason) Error() string { return w.message }

// Event reasons.
const (
	ReasonPlaced       = "FgpuPlaced"
	ReasonWaiting      = "FgpuWaiting"
	ReasonOverQuota    = "FgpuOverQuota"
	ReasonQuotaQueued  = "FgpuQuotaQueued"
	ReasonUnsupported  = "FgpuUnsupported"
	ReasonTimedOut     = "FgpuAllocationTimedOut"
	ReasonDeallocated  = "FgpuDeallocated"
	ReasonPlacedDetail = "placed"
)

// result is one device share the decision hands out.
type result struct {
	request     string
	gpu         *gpu
	mem, comp   int64
	whole       bool
	mode        api.SharingMode
	domain      string
	userCfg     *api.GpuConfig
	tolerations []resourceapi.DeviceToleration
	shareID     types.UID
	coTenants   int
}

type decision struct {
	node    string
	pol     policy.Effective
	results []result
	rec     *claimRec
}

// input is everything a decision depends on besides the state.
type input struct {
	claim   *resourceapi.ResourceClaim
	pods    []*corev1.Pod // pending pods that use the claim
	bound   string        // node of a consuming pod that is already bound
	pol     policy.Effective
	classes map[string]*resourceapi.DeviceClass
	avoid   map[string]bool
	// nodeFit memoises the pod-fit verdict per node for this decision.
	nodeFit map[string]error
	// fitAt and fitErr memoise the same by placement-core node index (0 unknown, 1 fits,
	// 2 does not, fitErr says why): the filter asks once per GPU, and hashing the node
	// name, or filling a map of every node, cost a fifth of a decision.
	fitAt  []int8
	fitErr []error
	// fit is each pending pod's checker, built once per decision; verdicts its node
	// verdicts (Controller.nodeVerdicts), looked up once per decision.
	fit      []*podfit.Checker
	verdicts [][]nodeVerdict
}

// decide chooses node, GPUs and sizes for a pending claim and records the shares in the
// state (assumed), or says why it waits. Caller holds c.mu.
func (c *Controller) decide(ctx context.Context, in *input) (*decision, *waitReason) {
	claim := in.claim
	if len(claim.Spec.Devices.Constraints) > 0 {
		return nil, &waitReason{reason: ReasonUnsupported, message: "the fgpu allocator does not support device constraints (spec.devices.constraints) yet"}
	}
	if c.st.dirty || c.st.core == nil {
		if err := c.st.rebuild(c.schedPolicy); err != nil {
			return nil, &waitReason{reason: ReasonWaiting, message: "cannot model the cluster: " + err.Error()}
		}
	}
	d := &decision{pol: in.pol, rec: &claimRec{uid: claim.UID, key: claim.Namespace + "/" + claim.Name, namespace: claim.Namespace, assumed: c.now()}}
	var firstWait *waitReason
	for _, req := range claim.Spec.Devices.Requests {
		placed := false
		for _, a := range alternatives(req) {
			res, w := c.placeAlt(ctx, in, d, a)
			if w != nil {
				if firstWait == nil {
					firstWait = w
				}
				continue
			}
			// Tentatively record the shares so the claim's next requests see them.
			c.st.remove(d.rec.key)
			for _, r := range res {
				d.results = append(d.results, r)
				d.rec.shares = append(d.rec.shares, &tenantAt{gpu: r.gpu, t: c.tenantOf(in, r)})
			}
			c.st.add(d.rec)
			placed = true
			break
		}
		if !placed {
			c.st.remove(d.rec.key)
			if firstWait == nil {
				firstWait = &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q has no way to be satisfied", req.Name)}
			}
			return nil, firstWait
		}
	}
	if len(d.results) == 0 {
		return nil, &waitReason{reason: ReasonUnsupported, message: "claim has no fgpu requests"}
	}
	for i := range d.results {
		d.results[i].coTenants = len(d.results[i].gpu.tenants) - 1
	}
	return d, nil
}

func (c *Controller) tenantOf(in *input, r result) *tenant {
	return &tenant{claim: in.claim.UID, key: in.claim.Namespace + "/" + in.claim.Name, namespace: in.claim.Namespace,
		shareID: r.shareID, mem: r.mem, comp: r.comp, whole: r.whole, domain: r.domain, mode: r.mode,
		latency: in.pol.Latency, maxCo: in.pol.MaxCoTenants, allowCrit: in.pol.AllowCriticalCoTenants,
		maxTenants: in.pol.MaxTenants, allowShare: in.pol.AllowSharedGPU, byUs: true}
}

// rejects counts why GPUs were turned down, for the waiting message.
type rejects struct {
	counts  map[string]int
	example map[string]string
}

func (r *rejects) add(cat, example string) {
	if r.counts == nil {
		r.counts, r.example = map[string]int{}, map[string]string{}
	}
	r.counts[cat]++
	if _, ok := r.example[cat]; !ok && example != "" {
		r.example[cat] = example
	}
}

func (r *rejects) String() string {
	cats := make([]string, 0, len(r.counts))
	for k := range r.counts {
		cats = append(cats, k)
	}
	sort.Slice(cats, func(i, j int) bool {
		return r.counts[cats[i]] > r.counts[cats[j]] || (r.counts[cats[i]] == r.counts[cats[j]] && cats[i] < cats[j])
	})
	parts := make([]string, 0, len(cats))
	for _, k := range cats {
		p := fmt.Sprintf("%d GPU(s): %s", r.counts[k], k)
		if e := r.example[k]; e != "" {
			p += " (e.g. " + e + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// size is what one GPU would give a request.
func (c *Controller) size(in *input, a alt, g *gpu, whole bool, memReq int64, compReq *int64) (mem, comp int64) {
	if whole {
		return g.memCap, g.compCap
	}
	mem = memReq
	switch {
	case compReq != nil:
		comp = *compReq
	case in.pol.ComputeFromMemory && g.memCap > 0:
		comp = int64(math.Ceil(float64(mem) * 100 / float64(g.memCap)))
	default:
		comp = in.pol.DefaultCompute
	}
	return mem, min(comp, g.compCap)
}

func (c *Controller) placeAlt(ctx context.Context, in *input, d *decision, a alt) ([]result, *waitReason) {
	claim := in.claim
	if !c.isFgpuClass(a.class) {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q asks for DeviceClass %q, which the fgpu allocator does not allocate; a claim that mixes fgpu and other devices cannot be allocated in allocator mode", a.name, a.class)}
	}
	class := in.classes[a.class]
	if class == nil {
		return nil, &waitReason{reason: ReasonWaiting, message: fmt.Sprintf("DeviceClass %q does not exist", a.class)}
	}
	if a.adminAccess {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: adminAccess is not supported by the fgpu allocator", a.name)}
	}
	if a.mode == resourceapi.DeviceAllocationModeAll {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: allocationMode All is not supported by the fgpu allocator; ask for a count", a.name)}
	}
	count := max(a.count, 1)
	cfg, err := userConfig(c.cfg.DriverName, class.Spec.Config, claim.Spec.Devices.Config, a.name)
	if err != nil {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: %v", a.name, err)}
	}
	memQ, hasMem := a.capacity[capMemory]
	whole := c.isExclusiveClass(a.class) || in.pol.Isolation == api.IsolationExclusive || !hasMem
	memReq := int64(0)
	if hasMem {
		if memQ.Sign() <= 0 {
			return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: memory %s must be positive", a.name, memQ.String())}
		}
		memReq = roundUp(memQ.Value(), MemoryStep)
	}
	var compReq *int64
	if q, ok := a.capacity[capCompute]; ok {
		v := q.Value()
		if v < 0 || v > 100 {
			return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: compute %s must be 0-100 (percent of a GPU)", a.name, q.String())}
		}
		compReq = &v
	}
	for k := range a.capacity {
		if k != capMemory && k != capCompute {
			return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q: unknown capacity %q (fgpu devices have memory and compute)", a.name, k)}
		}
	}
	// The mode and isolation domain the policy gives the claim (auto: decided per GPU).
	mode := api.SharingMode("")
	switch {
	case in.pol.Mode == api.PolicyModeMPS:
		mode = api.SharingModeMPS
	case in.pol.Mode == api.PolicyModeTimeSlicing:
		mode = api.SharingModeTimeSlicing
	case cfg.Mode != "":
		mode = cfg.Mode
	}
	domain := api.DefaultIsolationDomain
	switch in.pol.Isolation {
	case api.IsolationNamespace:
		domain = namespaceDomain(claim.Namespace)
	case api.IsolationNone:
		if cfg.IsolationDomain != "" {
			domain = cfg.IsolationDomain
		}
	case api.IsolationExclusive:
		domain = namespaceDomain(claim.Namespace)
	}
	if count > 1 && !whole && mode != api.SharingModeTimeSlicing {
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q asks for %d shares of GPUs through MPS, but a container reaches one MPS server: ask for whole GPUs, one share, or mode timeSlicing", a.name, count)}
	}
	// Quota, checked up front with the sizes known before a GPU is chosen.
	if w := c.quotaCheck(in, memReq*count, compReq, count, whole); w != nil {
		return nil, w
	}

	var rj rejects
	fixed := d.node
	if fixed == "" {
		fixed = in.bound
	}
	used := map[*gpu]bool{}
	for _, r := range d.results {
		used[r.gpu] = true
	}
	sels := c.selectorRefs(class.Spec.Selectors, a.selectors)
	filter := func(ni, gi int) bool {
		if gi < 0 || ni >= len(c.st.coreGPU) || gi >= len(c.st.coreGPU[ni]) {
			return false
		}
		g := c.st.coreGPU[ni][gi]
		if fixed != "" && g.node != fixed {
			rj.add("not the node the claim's other devices or pod are on", "")
			return false
		}
		if used[g] {
			rj.add("already used by this claim", "")
			return false
		}
		if err := c.nodeFitsAt(ctx, in, ni, g.node); err != nil {
			rj.add("pod does not fit the node", err.Error())
			return false
		}
		if why, ex := c.gpuFits(ctx, in, a, sels, g, whole, memReq, compReq, mode, domain); why != "" {
			rj.add(why, ex)
			return false
		}
		return true
	}
	share := int64(0)
	if !whole {
		share = milliOf(memReq, c.st.refMem, false)
	}
	sched := c.st.scheds[in.pol.Latency]
	if sched == nil {
		sched = c.st.scheds[api.LatencyStandard]
	}
	p, err := sched.Place(&placement.Request{Name: claim.Namespace + "/" + claim.Name, GPUs: int(count), Share: share, Filter: filter})
	if err != nil {
		what := "a whole GPU"
		if !whole {
			what = fmtBytes(memReq)
		}
		if count > 1 {
			what = fmt.Sprintf("%d × %s", count, what)
		}
		msg := fmt.Sprintf("no GPU can take %s now", what)
		var ue *placement.UnplaceableError
		if errors.As(err, &ue) && len(rj.counts) == 0 {
			msg += ": " + ue.Reason.String()
		}
		if len(c.st.coreGPU) == 0 {
			msg += ": no node publishes fgpu GPUs"
		}
		if s := rj.String(); s != "" {
			msg += ": " + s
		}
		quotaOnly := len(rj.counts) == 1 && rj.counts["over quota"] > 0
		if quotaOnly {
			return nil, &waitReason{reason: ReasonOverQuota, message: msg, quota: true}
		}
		return nil, &waitReason{reason: ReasonWaiting, message: msg}
	}
	out := make([]result, 0, len(p.GPUs))
	for _, gi := range p.GPUs {
		g := c.st.coreGPU[p.Node][gi]
		mem, comp := c.size(in, a, g, whole, memReq, compReq)
		m := mode
		if m == "" {
			m = gpuMode(g)
		}
		tol := append([]resourceapi.DeviceToleration{FenceToleration()}, a.tolerations...)
		out = append(out, result{request: a.name, gpu: g, mem: mem, comp: comp, whole: whole, mode: m, domain: domain,
			userCfg: cfg, tolerations: tol, shareID: uuid.NewUUID()})
	}
	d.node = c.st.coreGPU[p.Node][0].node
	return out, nil
}

// gpuMode is the mode of a GPU's tenants (MPS on an empty GPU).
func gpuMode(g *gpu) api.SharingMode {
	for _, t := range g.tenants {
		if !t.whole && t.mode != "" {
			return t.mode
		}
	}
	return api.SharingModeMPS
}

func (c *Controller) quotaCheck(in *input, mem int64, comp *int64, count int64, whole bool) *waitReason {
	p := in.pol
	ns := in.claim.Namespace
	if p.QuotaMemory != nil && !whole {
		q := p.QuotaMemory.Value()
		if used := c.st.nsMem[ns]; used+mem > q {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU memory quota of namespace %s (%s: %s): %s in use, this claim needs %s, %s over; it will be placed when quota frees up",
				ns, p.DisplayName(), p.QuotaMemory.String(), fmtBytes(used), fmtBytes(mem), fmtBytes(used+mem-q))}
		}
	}
	if p.QuotaCompute != nil && comp != nil && !whole {
		q := *p.QuotaCompute
		need := *comp * count
		if used := c.st.nsComp[ns]; used+need > q {
			return &waitReason{reason: ReasonOverQuota, quota: true, message: fmt.Sprintf(
				"over the GPU compute quota of namespace %s (%s: %d%%): %d%% in use, this claim needs %d%%, %d%% over; it will be placed when quota frees up",
				ns, p.DisplayName(), q, used, need, used+need-q)}
		}
	}
	return nil
}

// gpuFits says why GPU g cannot take one device of alternative a ("" if it can).
func (c *Controller) gpuFits(ctx context.Context, in *input, a alt, sels []selRef, g *gpu, whole bool, memReq int64, compReq *int64, mode api.SharingMode, domain string) (string, string) {
	if !c.selectorsMatch(ctx, g, sels) {
		return "device selectors do not match", ""
	}
	for _, t := range g.taints {
		if !tolerated(a.tolerations, t) {
			return "device taint not tolerated", fmt.Sprintf("%s: %s=%s:%s", g.key, t.Key, t.Value, t.Effect)
		}
	}
	mem, comp := c.size(in, a, g, whole, memReq, compReq)
	if mem > g.memCap {
		return "GPU too small", fmt.Sprintf("%s has %s", g.key, fmtBytes(g.memCap))
	}
	for _, t := range g.tenants {
		if t.whole {
			return "held whole by another claim", ""
		}
	}
	if whole && len(g.tenants) > 0 {
		return "not empty (a whole GPU was asked)", ""
	}
	if g.usedMem+mem > g.memCap {
		return "not enough free memory", fmt.Sprintf("%s has %s free", g.key, fmtBytes(g.memCap-g.usedMem))
	}
	if g.usedComp+comp > g.compCap {
		return "not enough free compute", fmt.Sprintf("%s has %d%% free", g.key, g.compCap-g.usedComp)
	}
	p := in.pol
	if p.QuotaMemory != nil && c.st.nsMem[in.claim.Namespace]+mem > p.QuotaMemory.Value() {
		return "over quota", ""
	}
	if p.QuotaCompute != nil && c.st.nsComp[in.claim.Namespace]+comp > *p.QuotaCompute {
		return "over quota", ""
	}
	n := len(g.tenants) + 1
	if p.MaxTenants > 0 && n > p.MaxTenants {
		return "at the policy's maxTenantsPerGPU", fmt.Sprintf("%s has %d tenants", g.key, n-1)
	}
	if p.Latency == api.LatencyCritical && len(g.tenants) > p.MaxCoTenants {
		return "more co-tenants than a critical claim allows", fmt.Sprintf("%s has %d, maxCoTenants %d", g.key, len(g.tenants), p.MaxCoTenants)
	}
	for _, t := range g.tenants {
		if t.maxTenants > 0 && n > t.maxTenants {
			return "at a tenant's maxTenantsPerGPU", ""
		}
		if t.latency == api.LatencyCritical {
			if p.Latency == api.LatencyCritical && !(p.AllowCriticalCoTenants && t.allowCrit) {
				return "holds another critical claim", t.key
			}
			if len(g.tenants) > t.maxCo {
				return "a critical tenant allows no more co-tenants", t.key
			}
		}
		if t.domain != domain && !(p.AllowSharedGPU && t.allowShare) {
			return "isolation: used by another namespace or isolation domain", ""
		}
		if mode != "" && t.mode != "" && t.mode != mode {
			return "its tenants use another sharing mode", fmt.Sprintf("%s is %s", g.key, t.mode)
		}
	}
	return "", ""
}

func tolerated(tols []resourceapi.DeviceToleration, t resourceapi.DeviceTaint) bool {
	for _, tol := range tols {
		if tol.Key != "" && tol.Key != t.Key {
			continue
		}
		if tol.Effect != "" && tol.Effect != t.Effect {
			continue
		}
		switch tol.Operator {
		case resourceapi.DeviceTolerationOpExists:
			return true
		case resourceapi.DeviceTolerationOpEqual, "":
			if tol.Value == t.Value {
				return true
			}
		}
	}
	return false
}

// selRef is a CEL selector interned for a decision: its expression and its index in
// every GPU's memo.
type selRef struct {
	id   int
	expr string
}

// selectorRefs interns the class's and the request's CEL selectors, once per decision, so
// that the per-GPU check is an index, not a string comparison per expression and GPU.
// Caller holds c.mu.
func (c *Controller) selectorRefs(lists ...[]resourceapi.DeviceSelector) []selRef {
	var out []selRef
	for _, sels := range lists {
		for _, s := range sels {
			if s.CEL == nil {
				continue
			}
			id, ok := c.selIDs[s.CEL.Expression]
			if !ok {
				if len(c.selIDs) >= maxSelectors {
					// Many distinct per-request selectors: start over, and let every
					// GPU's memo go stale with the old generation.
					clear(c.selIDs)
					c.selGen++
				}
				id = len(c.selIDs)
				c.selIDs[s.CEL.Expression] = id
			}
			out = append(out, selRef{id: id, expr: s.CEL.Expression})
		}
	}
	return out
}

const maxSelectors = 1024

// selectorsMatch evaluates interned selectors on a device, memoised per device.
func (c *Controller) selectorsMatch(ctx context.Context, g *gpu, sels []selRef) bool {
	if g.selGen != c.selGen {
		g.sel, g.selGen = g.sel[:0], c.selGen
	}
	for _, s := range sels {
		for len(g.sel) <= s.id {
			g.sel = append(g.sel, selUnknown)
		}
		if g.sel[s.id] == selUnknown {
			g.sel[s.id] = selNo
			if c.evalSelector(ctx, g, s.expr) {
				g.sel[s.id] = selYes
			}
		}
		if g.sel[s.id] != selYes {
			return false
		}
	}
	return true
}

func (c *Controller) evalSelector(ctx context.Context, g *gpu, expr string) bool {
	res := c.cel.GetOrCompile(expr)
	if res.Error != nil {
		return false
	}
	ok, _, err := res.DeviceMatches(ctx, cel.Device{Driver: c.cfg.DriverName, Attributes: g.attrs, Capacity: g.capacity, AllowMultipleAllocations: ptrTrue})
	return err == nil && ok
}

var ptrTrue = func() *bool { b := true; return &b }()

// nodeFits checks the claim's pods against a node: affinity, taints, CPU, memory, pods,
// the pod's other claims, and nodes where an earlier allocation timed out.
func (c *Controller) nodeFits(ctx context.Context, in *input, nodeName string) error {
	if err, ok := in.nodeFit[nodeName]; ok {
		return err
	}
	err := c.nodeFitsUncached(in, nodeName, -1)
	in.nodeFit[nodeName] = err
	return err
}

// nodeFitsAt is nodeFits for node ni of the placement core. Caller holds c.mu.
func (c *Controller) nodeFitsAt(ctx context.Context, in *input, ni int, nodeName string) error {
	if in.fitAt == nil {
		in.fitAt = make([]int8, len(c.st.coreGPU))
		in.fitErr = make([]error, len(c.st.coreGPU))
	}
	if ni >= len(in.fitAt) {
		return c.nodeFits(ctx, in, nodeName)
	}
	switch in.fitAt[ni] {
	case 1:
		return nil
	case 2:
		return in.fitErr[ni]
	}
	err := c.nodeFitsUncached(in, nodeName, ni)
	if err == nil {
		in.fitAt[ni] = 1
	} else {
		in.fitAt[ni], in.fitErr[ni] = 2, err
	}
	return err
}

// nodeFitsUncached checks the pods against node nodeName, which is node ni of the placement
// core (-1: unknown). Caller holds c.mu.
func (c *Controller) nodeFitsUncached(in *input, nodeName string, ni int) error {
	if in.avoid[nodeName] {
		return fmt.Errorf("an earlier allocation on node %s timed out: the pod did not bind there", nodeName)
	}
	node, err := c.nodes.Get(nodeName)
	if err != nil {
		return fmt.Errorf("node %s: no Node object", nodeName)
	}
	if len(in.pods) == 0 {
		return nil
	}
	requested := c.requestedOn(nodeName, in.pods)
	if in.fit == nil {
		in.fit = make([]*podfit.Checker, len(in.pods))
		for i, pod := range in.pods {
			in.fit[i] = podfit.NewChecker(pod)
		}
	}
	for i, pod := range in.pods {
		if err := c.fitsNode(in, i, ni, node); err != nil {
			return err
		}
		if err := in.fit[i].FitsResources(node, requested); err != nil {
			return err
		}
		requested.Add(in.fit[i].Requests)
		if err := c.otherClaimsFit(pod, in.claim, node); err != nil {
			return err
		}
	}
	return nil
}

// fitsNode is podfit's FitsNode for pending pod i, remembered across decisions: pods of one
// template ask the same of every node, and a decision asks every node. A verdict holds
// while the informer keeps the same Node object (any update replaces it). Caller holds c.mu.
func (c *Controller) fitsNode(in *input, i, ni int, node *corev1.Node) error {
	fit := in.fit[i]
	if ni < 0 || ni >= len(c.st.coreGPU) {
		return fit.FitsNode(node)
	}
	if in.verdicts == nil {
		in.verdicts = make([][]nodeVerdict, len(in.pods))
	}
	vs := in.verdicts[i]
	if len(vs) != len(c.st.coreGPU) {
		key := fit.ConstraintsKey()
		vs = c.nodeVerdicts[key]
		if len(vs) != len(c.st.coreGPU) {
			if len(c.nodeVerdicts) >= maxPodShapes {
				clear(c.nodeVerdicts)
			}
			vs = make([]nodeVerdict, len(c.st.coreGPU))
			c.nodeVerdicts[key] = vs
		}
		in.verdicts[i] = vs
	}
	v := &vs[ni]
	if v.node != node {
		v.node, v.err = node, fit.FitsNode(node)
	}
	return v.err
}

// nodeVerdict is FitsNode's answer for one Node object.
type nodeVerdict struct {
	node *corev1.Node
	err  error
}

// maxPodShapes bounds the pod constraint sets whose node verdicts are kept.
const maxPodShapes = 256

// requestedOn sums what bound pods and pods the allocator already pinned there ask of a
// node, except the pods being placed.
func (c *Controller) requestedOn(node string, except []*corev1.Pod) podfit.Requests {
	r := c.nodeReq[node]
	r.Add(c.nodeAssumed[node])
	for _, p := range except {
		if b, ok := c.podBound[p.UID]; ok && b.node == node {
			r.Sub(b.req)
		}
		if ap, ok := c.assumedPods[p.UID]; ok && ap.node == node {
			r.Sub(ap.req)
		}
	}
	return r
}

// otherClaimsFit checks that the pod's other allocated claims can be used on node.
func (c *Controller) otherClaimsFit(pod *corev1.Pod, self *resourceapi.ResourceClaim, node *corev1.Node) error {
	for _, name := range podClaimNames(pod) {
		if name == self.Name {
			continue
		}
		other, err := c.claims.ResourceClaims(pod.Namespace).Get(name)
		if err != nil || other.Status.Allocation == nil || other.Status.Allocation.NodeSelector == nil {
			continue
		}
		sel, err := nodeaffinity.NewNodeSelector(other.Status.Allocation.NodeSelector)
		if err != nil {
			continue
		}
		if !sel.Match(node) {
			return fmt.Errorf("the pod's claim %s is allocated where node %s is not", name, node.Name)
		}
	}
	return nil
}

// podClaimNames lists the ResourceClaim names a pod uses.
func podClaimNames(pod *corev1.Pod) []string {
	var out []string
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimName != nil {
			out = append(out, *rc.ResourceClaimName)
			continue
		}
		for _, s := range pod.Status.ResourceClaimStatuses {
			if s.Name == rc.Name && s.ResourceClaimName != nil {
				out = append(out, *s.ResourceClaimName)
			}
		}
	}
	return out
}

type assumedPod struct {
	node string
	req  podfit.Requests
	at   time.Time
}
