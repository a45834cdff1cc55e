#!/usr/bin/env bash
# The allocator's cost on a real API server: a fresh local cluster, the chart in allocator
# mode (its defaults: 1Gi memory limit, GOMEMLIMIT from it), NODES fake GPU nodes (Node
# objects and slices, no kubelet) and a burst of CLAIMS claims with pods. Prints the
# allocator's CPU and API writes per claim placed, its RSS, and, restarted with all of it
# present, when its informers synced and its first decision came. As root; tears the
# cluster down at the end.
#
#   NODES=10917 CLAIMS=20000 hack/bench-allocator.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NODES=${NODES:-500} CLAIMS=${CLAIMS:-2000}
hack/install-prereqs.sh >/dev/null
e2e/cluster/build.sh --cluster-only >/dev/null
e2e/cluster/down.sh >/dev/null 2>&1 || true
rm -rf /var/run/fgpu
trap 'e2e/cluster/down.sh >/dev/null 2>&1; rm -rf /var/run/fgpu' EXIT
e2e/cluster/up.sh >/dev/null
e2e/cluster/images.sh fgpu >/dev/null
export KUBECONFIG=$PWD/_output/cluster/kubeconfig
k=_output/bin/kubectl
_output/bin/helm upgrade --install fgpu deployments/helm/fgpu -n fgpu-system --create-namespace \
  -f deployments/helm/fgpu/values-fake.yaml -f e2e/values-local.yaml \
  --set allocationMode=allocator --set kubeletPlugin.gpus=fake:2xH100-80GB >/dev/null
$k -n fgpu-system rollout status deploy/fgpu-allocator --timeout 5m >/dev/null
# A reader of the allocator's /metrics (it serves them to holders of fgpu-metrics-reader).
$k -n fgpu-system create serviceaccount bench-reader >/dev/null
$k create clusterrolebinding bench-reader --clusterrole fgpu-metrics-reader --serviceaccount fgpu-system:bench-reader >/dev/null
token=$(mktemp)
$k -n fgpu-system create token bench-reader > "$token"

rss() { grep -E "VmHWM|VmRSS" "/proc/$1/status" | tr -s ' \t' ' ' | paste -sd, -; }
pid=$(pgrep -f -o fgpu-allocator)
echo "== $NODES nodes x 8 GPUs, a burst of $CLAIMS claims with pods (load $(cut -d' ' -f1-3 /proc/loadavg))"
go run ./test/performance/cmd/allocator-bench --kubeconfig "$KUBECONFIG" \
  --nodes "$NODES" --claims "$CLAIMS" --concurrency 32 --allocator-pid "$pid" \
  --allocator-metrics https://127.0.0.1:9465/metrics --allocator-metrics-insecure-skip-tls-verify \
  --allocator-metrics-token-file "$token" 2>&1 | tail -3
echo "allocator RSS: $(rss "$pid")"

echo "== the allocator restarted with all of it present"
$k -n fgpu-system rollout restart deploy/fgpu-allocator >/dev/null
$k -n fgpu-system rollout status deploy/fgpu-allocator --timeout 10m >/dev/null
sleep 30
pod=$($k -n fgpu-system get pods -l app.kubernetes.io/component=allocator --sort-by=.metadata.creationTimestamp -o name | tail -1)
log=$(mktemp)
$k -n fgpu-system logs "$pod" > "$log"
echo "container started $($k -n fgpu-system get "$pod" -o jsonpath='{.status.containerStatuses[0].state.running.startedAt}')"
echo "first log line:   $(head -c 200 "$log" | head -1)"
grep -m1 "Caches synced" "$log" || echo "informers not synced"
grep -m1 "Placed claim" "$log" | cut -c1-120 || echo "nothing placed yet"
echo "allocator RSS 30s after its restart: $(rss "$(pgrep -f -n fgpu-allocator)")"
rm -f "$token" "$log"
