package gpu

import "testing"

// An XID's severity is its recovery action's: the driver's where it gives one, the XID
// catalog's where it does not; an XID neither knows degrades the GPU.
func TestXIDSeverityFollowsTheRecoveryAction(t *testing.T) {
	for _, tc := range []struct {
		xid    uint64
		action RecoveryAction
		want   Severity
	}{
		{79, "", SeverityFatal},
		{48, "", SeverityFatal},
		{31, "", SeverityNone},
		{69, "", SeverityNone},
		{94, "", SeverityNone},
		{92, "", SeverityDegraded},
		{13, RecoveryGPUReset, SeverityFatal},
		{31, RecoveryNodeReboot, SeverityFatal},
		{79, RecoveryNone, SeverityNone},
		{92, RecoveryNone, SeverityNone},
		{92, RecoveryDrainP2P, SeverityDegraded},
		{48, RecoveryDrainAndReset, SeverityDegraded},
	} {
		f := Fault{Kind: FaultXID, XID: tc.xid, Action: tc.action}
		if got := f.Severity(); got != tc.want {
			t.Errorf("%s: severity %s, want %s", f, got, tc.want)
		}
	}
	if !ApplicationXID(43) || ApplicationXID(79) || ApplicationXID(92) {
		t.Error("ApplicationXID disagrees with the catalog")
	}
}
