package loadgen

import "k8s.io/apimachinery/pkg/watch"

func init() {
	// The fake API server's watchers panic when a consumer falls DefaultChanSize events
	// behind; a burst on two shared cores does. A real API server buffers far more.
	watch.DefaultChanSize = 1 << 16
}
