package controller

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	corelisters "k8s.io/client-go/listers/core/v1"

	api "github.com/fgpu-dev/fgpu/api/fgpu.dev/v1alpha1"
	"github.com/fgpu-dev/fgpu/pkg/controller/model"
	"github.com/fgpu-dev/fgpu/pkg/controller/podledger"
	"github.com/fgpu-dev/fgpu/pkg/gang"
	"github.com/fgpu-dev/fgpu/pkg/placement"
	"github.com/fgpu-dev/fgpu/pkg/podfit"
	"github.com/fgpu-dev/fgpu/pkg/policy"
	"github.com/fgpu-dev/fgpu/pkg/selectors"
	"github.com/fgpu-dev/fgpu/pkg/sizing/engine"
)

// input is everything a decision depends on besides the model.
type input struct {
	claim     *resourceapi.ResourceClaim
	consumers []*corev1.Pod // the live pods that use the claim
	pods      []*corev1.Pod // those of them not bound yet
	bound     string        // node of a consuming pod that is already bound
	pol       policy.Effective
	classes   map[string]*resourceapi.DeviceClass
	avoid     map[string]bool // nodes where the pods' earlier allocation timed out
	fit       nodeFit

	// reservedFor are the reservations a claim placed again after a refused prepare keeps
	// (the pods kube-scheduler reserved it for, bound to node bound).
	reservedFor []resourceapi.ResourceClaimConsumerReference
	// conflict: the consuming pods are bound to different nodes, and no placement serves
	// them all.
	conflict *waitReason
	// sized are the recommendations (by request name) of the claim's workload, where its
	// policy's sizing mode is Initial and they stand on enough samples; sizedFor names it.
	sized    map[string]api.SizingRecommendation
	sizedFor api.SizingWorkload
	// selectors are where each alternative's selectors (its class's and its own) match,
	// by alternative name, evaluated before the decision and outside the model's lock;
	// selectorsWait is why they could not be (too costly, or the namespace's share spent).
	selectors     map[string]selectors.Matches
	selectorsWait *waitReason
	// otherClaims are, by pod UID of consumers, the node selectors of the pod's other
	// claims that are allocated: looked up in gather, outside the model's lock, however
	// many claims the pod names.
	otherClaims map[types.UID][]otherClaim
	// gang are the node labels the pods should share with the other pods of their gang,
	// nearest first (gangLevels); gangNear marks, per level, the model's nodes that have it.
	gang     []gang.Level
	gangNear [][]bool
	// whatIf narrows the decision to GPUs a reclamation would free (reclaim.go plan).
	whatIf *whatIf
	// checks counts the GPUs the decision looked at, and the pods and claims checked on
	// each node: its cost to its namespace's share.
	checks int
}

// decision is where a claim goes: the node, and one result per device.
type decision struct {
	node    string
	pol     policy.Effective
	results []result
	rec     *model.Claim
	// reservedFor is written with the allocation: the pods a claim placed again after a
	// refused prepare was reserved for, which the scheduler will not reserve again.
	reservedFor []resourceapi.ResourceClaimConsumerReference
	// sized says, per request placed at a recommended size, what it asked and got.
	sized []string
	// cons are the claim's device constraints.
	cons []deviceConstraint
}

// result is one device share the decision hands out.
type result struct {
	request     string
	gpu         *model.GPU
	mem, comp   int64
	whole       bool
	mode        api.SharingMode
	domain      model.Domain
	userCfg     *api.GpuConfig
	tolerations []resourceapi.DeviceToleration
	shareID     types.UID
	coTenants   int
	// burstCap is the memory MPS lets a bursting share use, above mem; 0 where it does not burst.
	burstCap int64
}

// decider is the decision on a pending claim: its namespace's quota, the placement core's
// choice of node and GPUs among those the claim's pods fit (node fit, through the
// pod ledger) and which can take its devices (GPU fit), the shares' sizes, and their
// reservation in the model. It keeps no state of its own but memos; what it reads and
// writes is handed to it by New, each collaborator by itself rather than the Controller.
//
// It reads and reserves through a model transaction (tx), which every method that looks at
// the model takes: decideInQueue's around decide, and consolidation's around what it asks
// as placementPath. Inside one the decider takes only leaf locks (the pod ledger's, the
// refused-GPU memo's, the burst history's), never the sizer's, which is never held with
// the model's (sizingLoop).
type decider struct {
	cfg    *Config           // the controller's, as New completed it
	ledger *podledger.Ledger // what bound and assumed pods request per node
	nodes  corelisters.NodeLister
	// refused: GPUs whose kubelet plugin refused to prepare the claim are avoided a while.
	refused *refusedGPUs
	// burst is the sizing loop's burst history, which admits bursting shares to a GPU;
	// sizeBurst is the sizing loop's size for a share that may burst.
	burst     *engine.History[model.GPUKey]
	sizeBurst func(in *input, rq *request) bool
	// reserveText is the idle scaler's: what of the quota in use is kept for workloads
	// scaled to zero, in words.
	reserveText func(reserve model.Usage, amount string) string
	// memo is the pod-fit verdicts kept across decisions; only used inside a model
	// transaction, whose lock it shares.
	memo *fitMemos
	// reclaim keeps the GPUs it takes back for the claims they are taken back for.
	reclaim *reclaimer
}

func (dc *decider) now() time.Time { return dc.cfg.Now() }

// schedPolicy is the placement core's policy for a latency class: critical claims spread
// over the least-loaded GPUs, best-effort ones pack onto the fullest, standard ones use the
// configured policy, measuring against workload w (learned from the claims seen).
func (dc *decider) schedPolicy(l api.LatencyClass, w placement.Workload) placement.Policy {
	switch l {
	case api.LatencyCritical:
		return placement.Spread{}
	case api.LatencyBestEffort:
		return placement.Pack{}
	}
	p, err := placement.New(dc.cfg.Placement, w)
	if err != nil { // the allocator's flags refuse unknown policies; a test's config gets the default
		p = placement.NewFGPU(w, placement.DefaultOptions())
	}
	return p
}

// Allocatable is a Node's allocatable CPU (milli-cores) and memory (MiB) for the placement
// core: none without a Node object (pod fit refuses the node then), and a resource the
// Node does not report is not limited, as in pod fit.
func (dc *decider) Allocatable(name string) (cpuMilli, memMiB int64) {
	node, err := dc.nodes.Get(name)
	if err != nil {
		return 0, 0
	}
	cpuMilli, memMiB = unlimited, unlimited
	if q, ok := node.Status.Allocatable[corev1.ResourceCPU]; ok {
		cpuMilli = q.MilliValue()
	}
	if q, ok := node.Status.Allocatable[corev1.ResourceMemory]; ok {
		memMiB = q.Value() >> 20
	}
	return cpuMilli, memMiB
}

// unlimited stands for a resource a Node does not report: more than any node has, and
// small enough for the core's arithmetic.
const unlimited = int64(1) << 31

// Requested is what bound and assumed pods request on a node.
func (dc *decider) Requested(name string) podfit.Requests { return dc.ledger.Requested(name, nil) }

// ChangedNodes are the nodes whose Node or pods changed since it was last asked.
func (dc *decider) ChangedNodes() []string { return dc.ledger.TakeChanged() }

// decide chooses node, GPUs and sizes for a pending claim and reserves its shares in the
// model, or says why it waits.
func (dc *decider) decide(ctx context.Context, tx *model.Tx, in *input) (*decision, *waitReason) {
	claim := in.claim
	if in.conflict != nil {
		return nil, in.conflict
	}
	if in.selectorsWait != nil {
		return nil, in.selectorsWait
	}
	cons, w := claimConstraints(claim)
	if w != nil {
		return nil, w
	}
	if err := tx.EnsureCore(dc.schedPolicy, dc); err != nil {
		return nil, &waitReason{reason: ReasonWaiting, message: "cannot model the cluster: " + err.Error()}
	}
	res := newResolution(dc.cfg, in, dc.smallestGPU(tx, in))
	if w := dc.claimQuotaCheck(ctx, tx, in, res); w != nil {
		return nil, w
	}
	d, w := dc.decideClaim(ctx, tx, in, res, cons, "")
	if w == nil || !w.constrained {
		return d, w
	}
	// A match across requests is greedy: the first request's GPUs fix the value and the
	// node. Where that left a later request none, the claim is decided again with both
	// fixed first, on the nodes that have room for it all under one value (pins); it
	// waits for the first attempt's reason.
	for _, p := range dc.pins(tx, in, cons) {
		cons[p.constraint].pinned = p.value
		d, w2 := dc.decideClaim(ctx, tx, in, res, cons, p.node)
		cons[p.constraint].pinned = ""
		if w2 == nil {
			return d, nil
		}
	}
	return nil, w
}

// decideClaim places a claim's requests one after the other under its constraints, or
// says why it waits, leaving nothing reserved then.
// A node given fixes the claim's node (a pin).
func (dc *decider) decideClaim(ctx context.Context, tx *model.Tx, in *input, res *resolution, cons []deviceConstraint, node string) (*decision, *waitReason) {
	claim := in.claim
	d := &decision{node: node, pol: in.pol, cons: cons, rec: model.NewClaim(claim.UID, claimKey(claim), claim.Namespace, dc.now())}
	for _, req := range claim.Spec.Devices.Requests {
		// The claim waits for the request it could not place, not for an alternative an
		// earlier request did without: that one may say the claim is beyond its quota.
		placed, w := dc.decideRequest(ctx, tx, in, res, d, req)
		if !placed {
			tx.Remove(d.rec.Key())
			if w == nil {
				w = &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf("request %q has no way to be satisfied", req.Name)}
			}
			return nil, w
		}
	}
	if len(d.results) == 0 {
		return nil, &waitReason{reason: ReasonUnsupported, message: "claim has no fgpu requests"}
	}
	if n := mpsShares(d); n > 1 {
		// The plugin refuses to prepare it, and a bound pod would wait for ever.
		tx.Remove(d.rec.Key())
		return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf(
			"the claim would share %d GPUs through MPS, but a container reaches one MPS server: ask for whole GPUs, one share, or mode %s", n, api.SharingModeTimeSlicing)}
	}
	for i := range d.results {
		d.results[i].coTenants = d.results[i].gpu.NumTenants() - 1
	}
	return d, nil
}

// decideRequest places the first alternative of a request that fits, and reserves its
// shares in the model so that the claim's next requests see them. It returns the first
// reason an alternative gave for not fitting, unless that one is beyond the quota and a
// later one is not: a claim that can fit its quota must not be told it never will.
func (dc *decider) decideRequest(ctx context.Context, tx *model.Tx, in *input, res *resolution, d *decision, req resourceapi.DeviceRequest) (bool, *waitReason) {
	var firstWait *waitReason
	for _, a := range alternatives(req) {
		placed, w := dc.placeAlt(ctx, tx, in, res, d, a)
		if w != nil {
			if firstWait == nil || (firstWait.beyondQuota && !w.beyondQuota) {
				firstWait = w
			}
			continue
		}
		tx.Remove(d.rec.Key())
		for _, r := range placed {
			d.results = append(d.results, r)
			d.rec.AddShare(r.gpu, tenantOf(in, r))
		}
		tx.Add(d.rec)
		return true, firstWait
	}
	return false, firstWait
}

// placeAlt places one alternative of a request, as resolved: check the quota, let the
// placement core choose a node and GPUs among those that fit, and size the shares. A share
// that may burst but fits nowhere as one (no GPU admits it, the quota does not take its cap)
// is placed as Initial sizes it: a best-effort pod runs rather than wait for room to burst.
// If neither fits, the claim waits for the burst's reason.
func (dc *decider) placeAlt(ctx context.Context, tx *model.Tx, in *input, res *resolution, d *decision, a alt) ([]result, *waitReason) {
	rq, w := res.request(a)
	if w != nil {
		return nil, w
	}
	plain := *rq
	if !dc.sizeBurst(in, rq) {
		return dc.placeRequest(ctx, tx, in, d, rq)
	}
	placed, w := dc.placeRequest(ctx, tx, in, d, rq)
	if w == nil {
		return placed, nil
	}
	if placed, w2 := dc.placeRequest(ctx, tx, in, d, &plain); w2 == nil {
		d.sized = append(d.sized, fmt.Sprintf("request %q does not burst, for now: %s", a.name, w.message))
		return placed, nil
	}
	return nil, w
}

// placeRequest places a resolved request.
func (dc *decider) placeRequest(ctx context.Context, tx *model.Tx, in *input, d *decision, rq *request) ([]result, *waitReason) {
	if w := dc.quotaCheck(tx, in, d, rq); w != nil {
		return nil, w
	}
	var rj rejects
	share := int64(0)
	if !rq.whole {
		share = model.MilliOf(rq.mem, tx.RefMem(), false)
	}
	// The core gets what the simulator gives it: the pods' CPU and memory with the GPUs.
	var pods podfit.Requests
	for _, p := range in.pods {
		pods.Add(podfit.PodRequests(p))
	}
	rc := forAlt(d.cons, rq.alt.name, d.results, dc.cfg.DriverName)
	pr := &placement.Request{Name: claimKey(in.claim), CPUMilli: pods.MilliCPU, MemoryMiB: model.MebibytesUp(pods.Memory), GPUs: int(rq.count), Share: share,
		Filter: dc.gpuFilter(ctx, tx, in, d, rq, rc, &rj)}
	if rq.count > 1 {
		pr.Together, pr.Apart = rc.groups(tx.CoreGPUAt)
	}
	tx.Observe(in.claim.UID, pr, dc.schedPolicy)
	p, err := dc.placeNearGang(ctx, tx, in, d, rq, rc, pr)
	if err != nil {
		w := dc.unplaceable(tx, in, rq, rc, err, &rj)
		w.constrained = rc != nil && !w.quota && !w.beyondQuota
		return nil, w
	}
	chosen := make([]*model.GPU, len(p.GPUs))
	for i, gi := range p.GPUs {
		chosen[i] = tx.CoreGPUs()[p.Node][gi]
	}
	if msg := rc.satisfied(chosen); msg != "" {
		return nil, &waitReason{reason: ReasonWaiting, message: msg, constrained: true}
	}
	out := make([]result, 0, len(p.GPUs))
	for _, g := range chosen {
		mem, comp := rq.size(in.pol, g)
		tol := append([]resourceapi.DeviceToleration{api.FenceToleration()}, rq.alt.tolerations...)
		out = append(out, result{request: rq.alt.name, gpu: g, mem: mem, comp: comp, whole: rq.whole, mode: rq.mode, domain: rq.domain,
			userCfg: rq.userCfg, tolerations: tol, shareID: uuid.NewUUID(), burstCap: rq.capOn(g, mem)})
	}
	d.node = tx.CoreGPUs()[p.Node][0].Node()
	if rq.sized != "" {
		d.sized = append(d.sized, rq.sized)
	}
	return out, nil
}

// placeNearGang asks the placement core for pr, first on the nodes that share its gang's
// labels, nearest level first (input.gang), then on any node. The first request of a claim
// chooses the node; pr's own filter counts what it turns down on the last try only, which
// is the one a waiting claim is told about.
func (dc *decider) placeNearGang(ctx context.Context, tx *model.Tx, in *input, d *decision, rq *request, rc *requestConstraints, pr *placement.Request) (placement.Placement, error) {
	sched := tx.Scheduler(in.pol.Latency)
	if len(in.gang) == 0 || d.node != "" || in.bound != "" {
		return sched.Place(pr)
	}
	all := pr.Filter
	defer func() { pr.Filter = all }()
	if in.gangNear == nil {
		// The model's nodes by level, once per decision: alternatives and pins ask again.
		in.gangNear = make([][]bool, len(in.gang))
		for i, l := range in.gang {
			in.gangNear[i] = make([]bool, len(tx.CoreGPUs()))
			for ni, gs := range tx.CoreGPUs() {
				in.checks++
				if n, err := dc.nodes.Get(gs[0].Node()); err == nil && n.Labels[l.Key] == l.Value {
					in.gangNear[i][ni] = true
				}
			}
		}
	}
	for _, near := range in.gangNear {
		filter := dc.gpuFilter(ctx, tx, in, d, rq, rc, &rejects{})
		pr.Filter = func(ni, gi int) bool { return ni >= 0 && ni < len(near) && near[ni] && filter(ni, gi) }
		if p, err := sched.Place(pr); err == nil {
			return p, nil
		}
	}
	pr.Filter = all
	return sched.Place(pr)
}

// smallestGPU gives the memory of the smallest GPU the cluster publishes that a request's
// class and selectors allow (0 where none does), for sizing a whole-GPU request: asked only
// then, as it looks at every GPU.
func (dc *decider) smallestGPU(tx *model.Tx, in *input) func(*request) int64 {
	return func(rq *request) int64 {
		least := int64(0)
		for _, gs := range tx.CoreGPUs() {
			in.checks += len(gs)
			for _, g := range gs {
				if ok, _, _ := in.selectors[rq.alt.name].At(g.KeyText(), g.Version()); ok && g.MemCap() > 0 && (least == 0 || g.MemCap() < least) {
					least = g.MemCap()
				}
			}
		}
		return least
	}
}

// gpuFilter is the placement core's filter for a request: the GPUs whose node the pods fit
// and which can take one of its devices. It counts the GPUs it turns down by reason.
func (dc *decider) gpuFilter(ctx context.Context, tx *model.Tx, in *input, d *decision, rq *request, rc *requestConstraints, rj *rejects) func(ni, gi int) bool {
	fixed := d.node
	if fixed == "" {
		fixed = in.bound
	}
	used := map[*model.GPU]bool{}
	for _, r := range d.results {
		used[r.gpu] = true
	}
	own := d.use()
	keptForOthers := dc.reclaim.keptForOthers(claimKey(in.claim))
	return func(ni, gi int) bool {
		in.checks++
		if gi < 0 || ni >= len(tx.CoreGPUs()) || gi >= len(tx.CoreGPUs()[ni]) {
			return false
		}
		g := tx.CoreGPUs()[ni][gi]
		if fixed != "" && g.Node() != fixed {
			rj.add("not the node the claim's other devices or pod are on", "")
			return false
		}
		if used[g] {
			rj.add("already used by this claim", "")
			return false
		}
		if why := rc.admits(g); why != "" {
			rj.add(why, "")
			return false
		}
		if in.whatIf != nil && !in.whatIf.only[g] {
			rj.add("not a GPU the claim could take back", "")
			return false
		}
		if keptForOthers[g.Key()] {
			rj.add("kept for the claim it is being taken back for", "")
			return false
		}
		if in.whatIf != nil && dc.refused.Refused(in.claim.UID, g.Key(), dc.now(), dc.cfg.BindTimeout) {
			rj.add("its kubelet plugin refused to prepare this claim on it", "")
			return false
		}
		if in.whatIf == nil && dc.refused.Avoid(in.claim.UID, g.Key(), g.Use(), dc.now(), dc.cfg.BindTimeout) {
			rj.add(fmt.Sprintf("its kubelet plugin refused to prepare this claim on it (tried again once what the GPU holds changes, or %s after the refusal)", dc.cfg.BindTimeout), "")
			return false
		}
		if err := dc.nodeFitsAt(tx, in, ni, g.Node()); err != nil {
			rj.add("pod does not fit the node", err.Error())
			return false
		}
		if why, ex := dc.gpuFits(tx, in, own, rq, g); why != "" {
			rj.add(why, ex)
			return false
		}
		return true
	}
}

// unplaceable says why no GPU could take a request.
func (dc *decider) unplaceable(tx *model.Tx, in *input, rq *request, rc *requestConstraints, err error, rj *rejects) *waitReason {
	what := "a whole GPU"
	if !rq.whole {
		what = fmtBytes(rq.mem)
	}
	if rq.count > 1 {
		what = fmt.Sprintf("%d × %s", rq.count, what)
	}
	if rc != nil {
		what += " " + rc.describe(rq.count)
	}
	msg := fmt.Sprintf("no GPU can take %s now", what)
	var ue *placement.UnplaceableError
	if errors.As(err, &ue) && (len(rj.counts) == 0 || ue.Reason == placement.ReasonConstraint) {
		msg += ": " + ue.Reason.String()
	}
	if len(tx.CoreGPUs()) == 0 {
		msg += ": no node publishes fgpu GPUs"
	}
	if s := rj.String(); s != "" {
		msg += ": " + s
	}
	switch {
	case rj.onlyQuota():
		return &waitReason{reason: ReasonOverQuota, message: msg + "; it will be placed when quota frees up", quota: true}
	case rj.onlyBeyondQuota():
		example := ""
		if e := rj.example[reasonBeyondQuota]; e != "" {
			example = " (" + e + ")"
		}
		return &waitReason{reason: ReasonOverQuota, beyondQuota: true, message: fmt.Sprintf(
			"larger than the GPU quota of namespace %s (%s): %s would take more than the whole quota on %d GPU(s)%s, and no other GPU can take it; it will not be placed unless the quota is raised or smaller GPUs can take it",
			in.claim.Namespace, quotaText(in.pol.Quota), what, rj.counts[reasonBeyondQuota], example)}
	}
	return &waitReason{reason: ReasonWaiting, message: msg}
}

// tenantOf is the tenant a result makes of the claim on its GPU.
func tenantOf(in *input, r result) *model.Tenant {
	t := &model.Tenant{Claim: in.claim.UID, Key: claimKey(in.claim), Namespace: in.claim.Namespace,
		ShareID: r.shareID, Mem: r.mem, Comp: r.comp, Whole: r.whole, Domain: r.domain, Mode: r.mode,
		Latency: in.pol.Latency, MaxCo: in.pol.MaxCoTenants, AllowCrit: in.pol.AllowCriticalCoTenants,
		MaxTenants: in.pol.MaxTenants, AllowShare: in.pol.AllowSharedGPU, ByUs: true, BurstCap: r.burstCap}
	if r.burstCap > 0 {
		t.Workload = api.SizingWorkload{Namespace: in.sizedFor.Namespace, Kind: in.sizedFor.Kind, Name: in.sizedFor.Name, Request: r.request}
	}
	return t
}

// mpsShares counts the results that the plugin will serve through an MPS server: MPS, and
// less than the whole GPU (a whole GPU needs no server).
func mpsShares(d *decision) int {
	n := 0
	for _, r := range d.results {
		if r.mode == api.SharingModeMPS && r.mem < r.gpu.MemCap() {
			n++
		}
	}
	return n
}
