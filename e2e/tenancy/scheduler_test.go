package tenancy

import (
	"testing"
)

// Finding 1, scheduler mode: kube-scheduler places two namespaces'
// shares on the same GPUs, and they must still get separate MPS servers; a claim naming
// another namespace's domain stays in its own.
func TestSchedulerModeNamespacesNeverShareAPipe(t *testing.T) {
	useMode(t, schedulerMode)
	nss := namespaces(t, "sched", "fgpu.dev/e2e-tenancy-sched", 2)
	attackDomains(t, nss[0], cluster.Tenant(t, nss[1], "attacker"))
}
