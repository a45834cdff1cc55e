package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// initPIDNamespace is the kernel's initial PID namespace (PROC_PID_INIT_INO).
const initPIDNamespace = "pid:[4026531836]"

// InNodePIDNamespace reports whether the plugin (procRoot: its /proc) shares the node's PID
// namespace. NVML lists a GPU's processes in its caller's PID namespace and leaves out those
// outside it, so only there does the plugin see processes fgpu did not start. In the kernel's
// initial namespace it does; a node may itself run in a container (a kind node), so otherwise
// PID 1 decides: in the node's namespace it is the node's init, outside the plugin's
// container (another mount namespace); in a pod's own namespace it is the container's
// entrypoint (the plugin's mount namespace) or, with shareProcessNamespace, the pod's pause.
func InNodePIDNamespace(procRoot string) (bool, error) {
	pidNS, err := os.Readlink(filepath.Join(procRoot, "self", "ns", "pid"))
	if err != nil {
		return false, err
	}
	if pidNS == initPIDNamespace {
		return true, nil
	}
	comm, err := os.ReadFile(filepath.Join(procRoot, "1", "comm"))
	if err != nil {
		return false, err
	}
	if strings.TrimSpace(string(comm)) == "pause" {
		return false, nil
	}
	own, err := os.Readlink(filepath.Join(procRoot, "self", "ns", "mnt"))
	if err != nil {
		return false, err
	}
	first, err := os.Readlink(filepath.Join(procRoot, "1", "ns", "mnt"))
	if err != nil {
		return false, fmt.Errorf("compare with PID 1's mount namespace: %w", err)
	}
	return own != first, nil
}

// ownPIDNamespaceMessage tells a person why no GPU is judged foreign-busy.
const ownPIDNamespaceMessage = "fgpu's kubelet plugin does not run in the node's PID namespace (hostPID), so NVML shows it no process it did not start: GPUs busy with other workloads are offered and may be given MPS compute modes; run the plugin with hostPID: true (the chart does)"

// ReasonOwnPIDNamespace is the Warning event's reason on the Node.
const ReasonOwnPIDNamespace = "FgpuNoHostPID"
