package plugin

import "context"

// faultInjector stops a prepare at a chosen point so that an e2e test can kill the plugin
// there. Only a binary built with -tags fgpu_e2e has one (faults_e2e.go); in every other
// build faults is nil and Prepare runs straight through.
type faultInjector interface {
	// PrepareApplied runs after a prepare's side effects (MPS daemon, CDI spec) and
	// before the checkpoint says the claim is completed.
	PrepareApplied(ctx context.Context)
}

var faults faultInjector
