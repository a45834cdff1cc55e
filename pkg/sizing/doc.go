// Package sizing turns measured GPU use into sizes: the per-claim usage summaries the kubelet
// plugin publishes in a claim's status.devices[].data (Window makes the API's ShareUsage), and
// the per-workload recommender the allocator keeps from them (Histogram, Recommender). It is
// plain Go with no Kubernetes client, so the allocator, the plugin and the simulator share it.
package sizing
