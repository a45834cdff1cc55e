#!/usr/bin/env bash
# Checks that a cluster from up.sh works end to end, with nothing but the pause image:
#   a pod on the pod network and a hostNetwork pod reach Running, `kubectl exec` and `kubectl logs`
#   work (the kubelet's serving certificate is right), and DRA allocates: a DeviceClass, a
#   ResourceSlice of a made-up driver and a ResourceClaim get an allocation from the scheduler and
#   the pod is bound to the node (it then waits for a driver that never registers).
# Leaves nothing behind (namespace fgpu-smoke and the cluster-scoped objects are deleted).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[[ -f $KUBECONFIG_FILE ]] || die "no cluster: run e2e/cluster/up.sh"
NODE=$(kubectl_ get nodes -o 'jsonpath={.items[0].metadata.name}')
NS=fgpu-smoke
DRIVER=smoke.fgpu.dev

cleanup() {
  kubectl_ delete namespace "$NS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  kubectl_ delete resourceslice smoke-slice --ignore-not-found >/dev/null 2>&1 || true
  kubectl_ delete deviceclass "$DRIVER" --ignore-not-found >/dev/null 2>&1 || true
}
trap cleanup EXIT
fail() { log "smoke: FAIL: $*"; kubectl_ -n "$NS" get pods,resourceclaims -o wide >&2 || true; kubectl_ -n "$NS" get events >&2 || true; exit 1; }

kubectl_ create namespace "$NS" >/dev/null
wait_for "default service account in $NS" 30 kubectl_ -n "$NS" get serviceaccount default || fail "no service account"

t0=$(date +%s.%N)
kubectl_ -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $PAUSE_IMAGE, imagePullPolicy: Never}
---
apiVersion: v1
kind: Pod
metadata: {name: hostnet}
spec:
  hostNetwork: true
  terminationGracePeriodSeconds: 1
  containers:
  - {name: c, image: $PAUSE_IMAGE, imagePullPolicy: Never}
---
apiVersion: v1
kind: Pod
metadata: {name: logs}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: $PAUSE_IMAGE, imagePullPolicy: Never, command: [/pause, -v]}
EOF
kubectl_ -n "$NS" wait --for=condition=Ready pod/plain pod/hostnet --timeout=60s >/dev/null || fail "pods not Ready"
t1=$(date +%s.%N)
log "smoke: plain + hostNetwork pods Running in $(awk "BEGIN{printf \"%.2f\", $t1-$t0}")s"
ip=$(kubectl_ -n "$NS" get pod plain -o 'jsonpath={.status.podIP}')
[[ $ip == "${POD_CIDR%.*}".* ]] || fail "pod IP $ip not in $POD_CIDR"

out=$(kubectl_ -n "$NS" exec plain -- /pause -v 2>&1) || fail "exec: $out"
[[ $out == "fgpu pause" ]] || fail "exec printed '$out'"
log "smoke: kubectl exec ok"
succeeded() { [[ $(kubectl_ -n "$NS" get pod "$1" -o 'jsonpath={.status.phase}') == Succeeded ]]; }
wait_for "pod/logs to finish" 60 succeeded logs || fail "pod/logs did not succeed"
out=$(kubectl_ -n "$NS" logs logs 2>&1) || fail "logs: $out"
[[ $out == "fgpu pause" ]] || fail "logs printed '$out'"
log "smoke: kubectl logs ok"

kubectl_ apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: $DRIVER}
spec:
  selectors:
  - cel: {expression: 'device.driver == "$DRIVER"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: smoke-slice}
spec:
  driver: $DRIVER
  nodeName: $NODE
  pool: {name: $NODE, generation: 1, resourceSliceCount: 1}
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    capacity:
      memory: {value: 40Gi}
EOF
kubectl_ -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: share}
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: $DRIVER
        capacity:
          requests: {memory: 15Gi}
---
apiVersion: v1
kind: Pod
metadata: {name: claimer}
spec:
  terminationGracePeriodSeconds: 1
  resourceClaims: [{name: gpu, resourceClaimName: share}]
  containers:
  - name: c
    image: $PAUSE_IMAGE
    imagePullPolicy: Never
    resources: {claims: [{name: gpu}]}
EOF
allocated() {
  [[ $(kubectl_ -n "$NS" get resourceclaim share -o 'jsonpath={.status.allocation.devices.results[0].device}') == gpu-0 ]]
}
wait_for "DRA allocation" 60 allocated || fail "claim not allocated"
used=$(kubectl_ -n "$NS" get resourceclaim share -o 'jsonpath={.status.allocation.devices.results[0].consumedCapacity.memory}')
[[ $(kubectl_ -n "$NS" get pod claimer -o 'jsonpath={.spec.nodeName}') == "$NODE" ]] || fail "claimer not bound"
log "smoke: DRA allocated gpu-0 (consumed memory $used), pod bound to $NODE"
log "smoke: PASS"
