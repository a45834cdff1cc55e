// Package placement decides which node and which GPUs a fractional-GPU claim
// lands on. It is pure Go (no Kubernetes client, no cgo) so the allocator
// controller, the simulator and the benchmarks all drive the same code.
//
// A Cluster holds the free capacity of every node. The controller replays
// claims that are already allocated with Assign, forgets deleted ones with
// Release, and asks a Scheduler to Place new requests. State changes touch one
// node and notify the policy, which keeps its per-node caches (e.g. the node's
// fragmentation) current in O(changed node).
//
// GPU shares are integers: each GPU has a Capacity (1000 = one whole GPU in
// milli-GPU; a controller that shares by memory may use MiB instead) and a
// request asks for Share units of each of its GPUs, or for whole GPUs.
package placement
