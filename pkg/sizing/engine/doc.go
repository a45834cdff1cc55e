// Package engine is sizing Auto's decisions, in one place for the allocator and for `fgpu sim
// sizing`: which GPU admits a bursting share, how large a share is guaranteed and capped,
// when a running pod is recreated larger, smaller or to burst, which tenant leaves a GPU that
// fills, which GPU consolidation empties, and when a workload has been idle long enough to
// scale to zero. It is pure: it takes usage reports and the time they are judged at, and
// returns what to do. Who is evicted, when, and how it is told are the caller's (the
// allocator's API writes and events, the simulator's restarts), as VPA's recommender decides
// and its updater acts.
package engine
