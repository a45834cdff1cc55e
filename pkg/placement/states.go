package placement

import (
	"encoding/binary"
	"slices"
	"sort"
)

// The state index groups nodes whose state is identical: the same wiring (the groups its
// GPUs form, numbered alike on every node), the same capacities, free CPU and memory, and
// per GPU the same model, capacity and free share, in the same order.
// Policies whose score depends on a node's state only (stateScorer) give every node of a
// group the same score and GPUs, so a decision scores one node per group, the one with
// the smallest name, which is the node equal scores go to anyway: the decision is the
// one scoring every node would make. In a large fleet most nodes sit in few states
// (whole machines of a few types, full ones), so a decision touches far fewer nodes.
// Groups with no free GPU share are kept apart: no GPU request can use them. The groups
// with free share are also filed by their largest free share (a bucket of freeStep units)
// and, apart, those with a whole free GPU, so a GPU request visits only the groups where
// one of its GPUs could fit: a share s needs a GPU with s free (a bucket from s's up) or,
// where s is a whole GPU or more, a whole free GPU. Every group it skips is one the
// scheduler would turn down anyway, and as equal scores go to the smallest name whatever
// the order, the decision is the same.

// stateScorer is implemented by policies whose score of a node (and the GPUs it picks)
// depends only on the node's state and the request, and whose equal scores go to the
// smallest node name; scoresByState says whether this instance qualifies.
//
// subsetBound reports whether node n's score for r with its usable GPUs elig is at least
// its score with any subset of them (of r.GPUs or more), so that a filter that turns
// some down cannot make the node score higher (filtered.go).
type stateScorer interface {
	scoresByState() bool
	subsetBound(c *Cluster, n int, r *Request, elig []int) bool
}

// oneCapacity reports whether the GPUs elig of node n all have the same capacity: then
// any r.GPUs of them leave the node in states alike to the policies, when whole GPUs are
// taken.
func oneCapacity(c *Cluster, n int, elig []int) bool {
	capa := c.nodes[n].gpuCap
	for _, g := range elig {
		if capa[g] != capa[elig[0]] {
			return false
		}
	}
	return true
}

type stateGroup struct {
	key     string
	gen     uint64  // taken afresh by each state the group holds (stateScores)
	members []int32 // node indices, by name (rank)
	first   int32   // members[0], the member with the smallest name (-1: none)
	live    bool    // some GPU has free share
	at      int32   // position in the cluster's live or spent list
	bucket  int32   // freeBucket of the largest free share (live groups)
	atFree  int32   // position in byFree[bucket]
	atWhole int32   // position in whole (-1: no whole free GPU)
}

// freeStep is the width of a byFree bucket and freeBuckets their number: shares of a
// 1000-unit GPU in steps of 8; larger free shares share the last bucket.
const (
	freeStep    = 8
	freeBuckets = 128
)

// freeBucket is the byFree bucket of a free share.
func freeBucket(v int64) int32 { return int32(min(v/freeStep, freeBuckets-1)) }

type stateIndex struct {
	groups  []stateGroup
	free    []int32 // unused group ids
	byKey   map[string]int32
	live    []int32              // groups with free GPU share
	spent   []int32              // groups without
	byFree  [freeBuckets][]int32 // live groups by their largest free share
	whole   []int32              // live groups with a whole free GPU
	group   []int32              // each node's group
	gens    uint64               // the last generation given to a group
	rank    []int32              // each node's position in (name, index) order
	scratch []byte
}

func (c *Cluster) indexStates() {
	x := &c.states
	n := len(c.nodes)
	x.byKey = map[string]int32{}
	x.group, x.rank = make([]int32, n), make([]int32, n)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	// Stable: equal names keep index order, as the scheduler's strict name comparison does.
	sort.SliceStable(order, func(a, b int) bool { return c.nodes[order[a]].name < c.nodes[order[b]].name })
	for r, i := range order {
		x.rank[i] = int32(r)
	}
	for i := range c.nodes {
		x.group[i] = -1
		c.restate(i)
	}
}

// stateKey encodes node n's state.
func (c *Cluster) stateKey(n int) []byte {
	nd := &c.nodes[n]
	b := c.states.scratch[:0]
	b = binary.AppendUvarint(b, uint64(nd.wiring))
	b = binary.AppendVarint(b, nd.cpuCap)
	b = binary.AppendVarint(b, nd.memCap)
	b = binary.AppendVarint(b, nd.cpuFree)
	b = binary.AppendVarint(b, nd.memFree)
	for g := range nd.gpuCap {
		b = append(b, nd.gpuModel[g])
		b = binary.AppendVarint(b, nd.gpuCap[g])
		b = binary.AppendVarint(b, nd.gpuFree[g])
	}
	c.states.scratch = b
	return b
}

// restate moves node n to the group of its current state.
func (c *Cluster) restate(n int) {
	x := &c.states
	key := c.stateKey(n)
	old := x.group[n]
	if old >= 0 && x.groups[old].key == string(key) {
		return
	}
	id, ok := x.byKey[string(key)]
	if !ok {
		nd := &c.nodes[n]
		var most int64
		whole := false
		for g, f := range nd.gpuFree {
			most = max(most, f)
			whole = whole || (f > 0 && f == nd.gpuCap[g])
		}
		live := most > 0
		x.gens++
		g := stateGroup{key: string(key), gen: x.gens, first: -1, live: live, atWhole: -1}
		if k := len(x.free); k > 0 {
			id, x.free = x.free[k-1], x.free[:k-1]
			g.members = x.groups[id].members[:0]
			x.groups[id] = g
		} else {
			id = int32(len(x.groups))
			x.groups = append(x.groups, g)
		}
		x.byKey[g.key] = id
		list := &x.spent
		if live {
			list = &x.live
		}
		x.groups[id].at = int32(len(*list))
		*list = append(*list, id)
		if live {
			b := freeBucket(most)
			x.groups[id].bucket, x.groups[id].atFree = b, int32(len(x.byFree[b]))
			x.byFree[b] = append(x.byFree[b], id)
			if whole {
				x.groups[id].atWhole = int32(len(x.whole))
				x.whole = append(x.whole, id)
			}
		}
	}
	if old >= 0 {
		x.leave(n, old)
	}
	g := &x.groups[id]
	x.group[n] = id
	g.members = slices.Insert(g.members, x.at(g.members, n), int32(n))
	g.first = g.members[0]
}

// at is where node n is, or goes, in members (ordered by rank).
func (x *stateIndex) at(members []int32, n int) int {
	r := x.rank[n]
	return sort.Search(len(members), func(i int) bool { return x.rank[members[i]] >= r })
}

// leave takes node n out of group id, dropping the group once empty.
func (x *stateIndex) leave(n int, id int32) {
	g := &x.groups[id]
	i := x.at(g.members, n)
	g.members = slices.Delete(g.members, i, i+1)
	if len(g.members) == 0 {
		delete(x.byKey, g.key)
		list := &x.spent
		if g.live {
			list = &x.live
		}
		moved := (*list)[len(*list)-1]
		(*list)[g.at] = moved
		x.groups[moved].at = g.at
		*list = (*list)[:len(*list)-1]
		if g.live {
			b := &x.byFree[g.bucket]
			moved := (*b)[len(*b)-1]
			(*b)[g.atFree] = moved
			x.groups[moved].atFree = g.atFree
			*b = (*b)[:len(*b)-1]
			if g.atWhole >= 0 {
				moved := x.whole[len(x.whole)-1]
				x.whole[g.atWhole] = moved
				x.groups[moved].atWhole = g.atWhole
				x.whole = x.whole[:len(x.whole)-1]
			}
		}
		g.key, g.first = "", -1
		x.free = append(x.free, id)
		return
	}
	g.first = g.members[0]
}

// States is how many distinct node states the cluster holds, and how many of them have
// free GPU share: what a decision scores at most.
func (c *Cluster) States() (all, withGPU int) {
	return len(c.states.live) + len(c.states.spent), len(c.states.live)
}
