#!/usr/bin/env bash
# Prints the local cluster's state: each component's pid (or "down"), the node, and the paths.
# Exit status 0 when every component runs and the API server is ready, 1 otherwise.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

rc=0
for c in etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet; do
  if pid_alive "$c"; then
    printf '%-24s running (pid %s)\n' "$c" "$(<"$STATE_DIR/pids/$c.pid")"
  else
    printf '%-24s down\n' "$c"; rc=1
  fi
done
if [[ -f $KUBECONFIG_FILE ]] && kubectl_ get --raw /readyz >/dev/null 2>&1; then
  kubectl_ get nodes -o wide
else
  echo "kube-apiserver: not ready"; rc=1
fi
echo "state dir:   $STATE_DIR"
echo "kubeconfig:  $KUBECONFIG_FILE"
echo "containerd:  $CONTAINERD_SOCK"
exit $rc
