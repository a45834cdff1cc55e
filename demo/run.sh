#!/usr/bin/env bash
# make demo: a real local Kubernetes cluster, fgpu on two fake 80Gi GPUs, four pods of 10, 20,
# 30 and 60Gi sharing them, and a table of who got what.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export KUBECONFIG=$root/_output/cluster/kubeconfig
kubectl=_output/bin/kubectl
helm=_output/bin/helm
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Installing prerequisites and building the cluster's binaries (cached after the first run)"
hack/install-prereqs.sh
e2e/cluster/build.sh

step "Starting the local cluster"
if ! e2e/cluster/status.sh >/dev/null 2>&1; then
  e2e/cluster/down.sh >/dev/null 2>&1 || true
  e2e/cluster/up.sh
fi

step "Building the fgpu image and installing the chart with fake GPUs"
e2e/cluster/images.sh fgpu
$helm upgrade --install fgpu deployments/helm/fgpu -n fgpu-system --create-namespace \
  -f deployments/helm/fgpu/values-fake.yaml -f e2e/values-local.yaml --wait --timeout 3m
for _ in $(seq 1 60); do
  [[ -n $($kubectl get resourceslices -o name 2>/dev/null) ]] && break
  sleep 1
done
$kubectl get resourceslices -o custom-columns=SLICE:.metadata.name,NODE:.spec.nodeName,DEVICES:.spec.devices[*].name

step "Running four pods that ask for 10, 20, 30 and 60Gi"
$kubectl apply -f demo/specs/
$kubectl wait -n fgpu-demo --for=condition=Ready pod -l app.kubernetes.io/part-of=fgpu-demo --timeout=3m
$kubectl get pods -n fgpu-demo -o wide

step "Who got what"
go run ./cmd/fgpu gpus

step "What the 10Gi pod's container received (printed by fgpu-probe inside it)"
$kubectl logs -n fgpu-demo a-10gi | grep -v '^FGPU-PROBE'

step "What each GPU's MPS server was told (recorded by the fake backend's MPS stand-in)"
for state in /var/run/fgpu/mps/*/log/fake-mps-state.json; do
  echo "$(basename "$(dirname "$(dirname "$state")")"): $(cat "$state")"
done

printf '\nThe cluster is still up: KUBECONFIG=%s %s get pods -A\n`make demo-down` tears it down.\n' "$KUBECONFIG" "$kubectl"
