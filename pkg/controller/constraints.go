package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/fgpu-dev/fgpu/pkg/controller/model"
)

// A claim's spec.devices.constraints, as the decision applies them one request at a time:
// a request's GPUs are chosen among those whose attribute agrees with the devices the
// claim's earlier requests got (the filter), and among its own GPUs the placement core
// keeps them to one value (matchAttribute: placement.Request.Together) or to different
// values (distinctAttribute: Apart). A GPU without the attribute never satisfies either, as
// in kube-scheduler's allocator.

// deviceConstraint is one entry of spec.devices.constraints.
type deviceConstraint struct {
	requests []string // the requests it binds ("req" or "req/sub"); empty: all of them
	attr     resourceapi.FullyQualifiedName
	distinct bool
	// pinned is the value a match across requests is held to when the claim is decided
	// again value by value (decide): the first request may otherwise take a value the
	// later ones cannot have.
	pinned string
}

// maxPins bounds how many times a claim is decided again with a match constraint's value
// and node fixed: each pin decides the whole claim again, at the namespace's cost.
const maxPins = 8

// claimConstraints reads a claim's constraints, or says why the allocator cannot honour
// them.
func claimConstraints(claim *resourceapi.ResourceClaim) ([]deviceConstraint, *waitReason) {
	var out []deviceConstraint
	for i, c := range claim.Spec.Devices.Constraints {
		dc := deviceConstraint{requests: c.Requests}
		switch {
		case c.MatchAttribute != nil && c.DistinctAttribute == nil:
			dc.attr = *c.MatchAttribute
		case c.DistinctAttribute != nil && c.MatchAttribute == nil:
			dc.attr, dc.distinct = *c.DistinctAttribute, true
		default:
			return nil, &waitReason{reason: ReasonUnsupported, message: fmt.Sprintf(
				"constraint %d names neither one matchAttribute nor one distinctAttribute, the constraints the fgpu allocator honours", i)}
		}
		// A constraint written twice binds no more than once; deciding it twice would
		// only cost more.
		if !slices.ContainsFunc(out, func(o deviceConstraint) bool {
			return o.attr == dc.attr && o.distinct == dc.distinct && slices.Equal(o.requests, dc.requests)
		}) {
			out = append(out, dc)
		}
	}
	return out, nil
}

// binds reports whether the constraint applies to the devices of alternative alt ("req"
// or "req/sub"): a constraint naming a request binds every subrequest of it.
func (c *deviceConstraint) binds(alt string) bool {
	if len(c.requests) == 0 {
		return true
	}
	parent, _, _ := strings.Cut(alt, "/")
	return slices.Contains(c.requests, alt) || slices.Contains(c.requests, parent)
}

// kind is how the constraint is written in a claim, for messages.
func (c *deviceConstraint) kind() string {
	if c.distinct {
		return "distinctAttribute " + string(c.attr)
	}
	return "matchAttribute " + string(c.attr)
}

// attrValue is a GPU's value of a fully qualified attribute name, typed so that a string
// "1" and an integer 1 differ; an attribute in the driver's own domain is also found by
// its bare name, as the plugin publishes it.
func attrValue(g *model.GPU, name resourceapi.FullyQualifiedName, driver string) (string, bool) {
	a, ok := g.Attributes()[resourceapi.QualifiedName(name)]
	if !ok {
		domain, id, found := strings.Cut(string(name), "/")
		if !found || domain != driver {
			return "", false
		}
		if a, ok = g.Attributes()[resourceapi.QualifiedName(id)]; !ok {
			return "", false
		}
	}
	return model.TypedValue(a)
}

// shownValue is a value as attrValue keeps it, for messages.
func shownValue(v string) string {
	_, s, _ := strings.Cut(v, ":")
	return s
}

// requestConstraints are the constraints binding one alternative, with what the claim's
// earlier results fixed: the value a match must keep, the values a distinct must avoid.
type requestConstraints struct {
	driver string
	match  []boundConstraint
	apart  []boundConstraint
}

type boundConstraint struct {
	c     *deviceConstraint
	fixed string          // match: the value earlier results (or the pin) hold it to
	taken map[string]bool // distinct: the values earlier results have
}

// forAlt gathers the constraints binding alt, given the results the claim has so far.
func forAlt(cs []deviceConstraint, alt string, earlier []result, driver string) *requestConstraints {
	rc := &requestConstraints{driver: driver}
	for i := range cs {
		c := &cs[i]
		if !c.binds(alt) {
			continue
		}
		b := boundConstraint{c: c, fixed: c.pinned}
		for _, r := range earlier {
			if !c.binds(r.request) {
				continue
			}
			v, _ := attrValue(r.gpu, c.attr, driver)
			if c.distinct {
				if b.taken == nil {
					b.taken = map[string]bool{}
				}
				b.taken[v] = true
			} else if b.fixed == "" {
				b.fixed = v
			}
		}
		if c.distinct {
			rc.apart = append(rc.apart, b)
		} else {
			rc.match = append(rc.match, b)
		}
	}
	if len(rc.match) == 0 && len(rc.apart) == 0 {
		return nil
	}
	return rc
}

// admits says why GPU g cannot take a device of the alternative, "" when it can: it lacks
// a constrained attribute, or its value disagrees with the claim's earlier devices.
func (rc *requestConstraints) admits(g *model.GPU) string {
	if rc == nil {
		return ""
	}
	for _, b := range rc.match {
		v, ok := attrValue(g, b.c.attr, rc.driver)
		switch {
		case !ok:
			return fmt.Sprintf("it has no attribute %s (the claim's %s)", b.c.attr, b.c.kind())
		case b.fixed != "" && v != b.fixed:
			return fmt.Sprintf("its %s is not %s, which the claim's other devices have (%s)", b.c.attr, shownValue(b.fixed), b.c.kind())
		}
	}
	for _, b := range rc.apart {
		v, ok := attrValue(g, b.c.attr, rc.driver)
		switch {
		case !ok:
			return fmt.Sprintf("it has no attribute %s (the claim's %s)", b.c.attr, b.c.kind())
		case b.taken[v]:
			return fmt.Sprintf("its %s, %s, is one the claim's other devices have (%s)", b.c.attr, shownValue(v), b.c.kind())
		}
	}
	return ""
}

// groups gives the placement core, for an alternative of several devices, the group of
// each GPU under the constraints (placement.Request.Together and Apart): GPUs with equal
// values of every matched attribute are one Together group, GPUs with equal values of a
// distinct attribute one Apart group. More than one distinct attribute on a request of
// several devices is checked after the core chose (satisfied), not steered.
func (rc *requestConstraints) groups(gpuAt func(ni, gi int) *model.GPU) (together, apart func(ni, gi int) int) {
	if rc == nil {
		return nil, nil
	}
	group := func(cs []boundConstraint) func(ni, gi int) int {
		ids := map[string]int{}
		return func(ni, gi int) int {
			g := gpuAt(ni, gi)
			if g == nil {
				return -1
			}
			var key strings.Builder
			for _, b := range cs {
				v, ok := attrValue(g, b.c.attr, rc.driver)
				if !ok {
					return -1
				}
				key.WriteString(v)
				key.WriteByte(0)
			}
			id, ok := ids[key.String()]
			if !ok {
				id = len(ids)
				ids[key.String()] = id
			}
			return id
		}
	}
	if len(rc.match) > 0 {
		together = group(rc.match)
	}
	if len(rc.apart) > 0 {
		apart = group(rc.apart[:1])
	}
	return together, apart
}

// satisfied checks the GPUs chosen for one alternative against its constraints, for what
// groups does not steer (a second distinct attribute): the message when they break one.
func (rc *requestConstraints) satisfied(gpus []*model.GPU) string {
	if rc == nil {
		return ""
	}
	for _, b := range rc.apart {
		seen := map[string]bool{}
		for _, g := range gpus {
			v, _ := attrValue(g, b.c.attr, rc.driver)
			if seen[v] {
				return fmt.Sprintf("the GPUs that can take it do not have a different %s each (distinctAttribute)", b.c.attr)
			}
			seen[v] = true
		}
	}
	return ""
}

// describe is what a failed placement says about the constraints that shaped it.
func (rc *requestConstraints) describe(count int64) string {
	var parts []string
	for _, b := range rc.match {
		switch {
		case b.fixed != "":
			parts = append(parts, fmt.Sprintf("with %s %s like the claim's other devices (matchAttribute)", b.c.attr, shownValue(b.fixed)))
		case count > 1:
			parts = append(parts, fmt.Sprintf("in one %s (matchAttribute)", b.c.attr))
		default:
			parts = append(parts, fmt.Sprintf("with attribute %s (matchAttribute)", b.c.attr))
		}
	}
	for _, b := range rc.apart {
		parts = append(parts, fmt.Sprintf("each with a different %s (distinctAttribute)", b.c.attr))
	}
	if len(parts) > 3 { // the claim's status stays readable
		parts = append(parts[:3], fmt.Sprintf("%d more constraints", len(parts)-3))
	}
	return strings.Join(parts, " and ")
}

// spansRequests reports whether a match constraint binds devices of more than one of the
// claim's requests, so that the first one's value and node can leave the others none; need
// is how many devices it binds at least (each request's smallest alternative).
func (c *deviceConstraint) spansRequests(claim *resourceapi.ResourceClaim) (spans bool, need int64) {
	if c.distinct {
		return false, 0
	}
	n := 0
	for _, r := range claim.Spec.Devices.Requests {
		least := int64(-1)
		for _, a := range alternatives(r) {
			if c.binds(a.name) && (least < 0 || max(a.count, 1) < least) {
				least = max(a.count, 1)
			}
		}
		if least > 0 {
			n++
			need += least
		}
	}
	return n > 1, need
}

// pin is a decision fixed to one value of a match constraint on one node.
type pin struct {
	constraint  int
	node, value string
}

// pins are where a claim whose match across requests failed greedily is decided again:
// for its first such constraint, the (node, value) pairs whose GPUs are enough for every
// device it binds, those with the fewest such GPUs first (they keep the larger groups
// whole), at most maxPins. A claim whose pod is bound keeps to its node.
func (dc *decider) pins(tx *model.Tx, in *input, cons []deviceConstraint) []pin {
	for i := range cons {
		spans, need := cons[i].spansRequests(in.claim)
		if !spans {
			continue
		}
		type at struct{ node, value string }
		count := map[at]int64{}
		for _, gs := range tx.CoreGPUs() {
			in.checks += len(gs)
			for _, g := range gs {
				if v, ok := attrValue(g, cons[i].attr, dc.cfg.DriverName); ok && (in.bound == "" || g.Node() == in.bound) {
					count[at{g.Node(), v}]++
				}
			}
		}
		var out []pin
		for k, n := range count {
			if n >= need {
				out = append(out, pin{constraint: i, node: k.node, value: k.value})
			}
		}
		slices.SortFunc(out, func(a, b pin) int {
			return cmp.Or(cmp.Compare(count[at{a.node, a.value}], count[at{b.node, b.value}]), strings.Compare(a.node, b.node), strings.Compare(a.value, b.value))
		})
		return out[:min(len(out), maxPins)]
	}
	return nil
}
