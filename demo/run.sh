#!/usr/bin/env bash
# make demo: a real local Kubernetes cluster, fgpu in allocator mode on three fake 80Gi GPUs,
# four pods of 10, 20, 30 and 60Gi from two teams sharing them under sharing policies (one of
# them latency-critical), a table of who got what, and a third team's notebook written for
# NVIDIA's device plugin that runs unchanged, is measured, and comes back at its size.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
export KUBECONFIG=$root/_output/cluster/kubeconfig
kubectl=_output/bin/kubectl
helm=_output/bin/helm
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Installing prerequisites and building the cluster's binaries (cached after the first run)"
hack/install-prereqs.sh
e2e/cluster/build.sh --cluster-only

step "Starting the local cluster"
if ! e2e/cluster/status.sh >/dev/null 2>&1; then
  e2e/cluster/down.sh >/dev/null 2>&1 || true
  e2e/cluster/up.sh
fi

step "Building the fgpu image and installing the chart with fake GPUs"
e2e/cluster/images.sh fgpu
$helm upgrade --install fgpu deployments/helm/fgpu -n fgpu-system --create-namespace \
  -f deployments/helm/fgpu/values-fake.yaml -f e2e/values-local.yaml -f demo/values-demo.yaml
# The image tag stays fgpu.dev/fgpu:dev across rebuilds: restart to run what was just built.
$kubectl -n fgpu-system rollout restart ds/fgpu-kubelet-plugin deploy/fgpu-allocator >/dev/null
$kubectl -n fgpu-system rollout status ds/fgpu-kubelet-plugin --timeout 3m
$kubectl -n fgpu-system rollout status deploy/fgpu-allocator --timeout 3m
for _ in $(seq 1 60); do
  [[ -n $($kubectl get resourceslices -o name 2>/dev/null) ]] && break
  sleep 1
done
$kubectl get resourceslices -o custom-columns=SLICE:.metadata.name,NODE:.spec.nodeName,DEVICES:.spec.devices[*].name,TAINT:.spec.devices[0].taints[0].key

step "Two teams and their sharing policies"
$kubectl apply -f demo/specs/00-namespaces.yaml -f demo/specs/01-policies.yaml
$kubectl get sharingpolicies

step "Pods arrive one by one: team-a's critical 20Gi, team-b's 60Gi and 30Gi batch jobs, team-a's 10Gi"
for spec in demo/specs/1*.yaml; do
  ns=$(awk '/namespace:/ {print $2; exit}' "$spec")
  pod=$(awk '/^kind: Pod/ {p=1} p && /name:/ {print $2; exit}' "$spec")
  $kubectl apply -f "$spec" >/dev/null
  $kubectl wait -n "$ns" --for=condition=Ready "pod/$pod" --timeout=3m >/dev/null
  $kubectl get events -n "$ns" --field-selector "involvedObject.name=$pod,reason=FgpuPlaced" \
    -o custom-columns=POD:.involvedObject.name,DECISION:.message --no-headers | tail -1
done
$kubectl get pods -n team-a -o wide
$kubectl get pods -n team-b -o wide

step "Who got what"
go run ./cmd/fgpu gpus

step "A workload written for NVIDIA's device plugin, unchanged: team-c's notebook asks for nvidia.com/gpu: 1"
$kubectl apply -f demo/specs/20-team-c.yaml >/dev/null
$kubectl -n team-c rollout status deploy/notebook --timeout 3m >/dev/null
echo "its Deployment asks for: $($kubectl -n team-c get deploy notebook -o jsonpath='{.spec.template.spec.containers[0].resources.limits}')"
$kubectl -n team-c get pods -l app=notebook \
  -o custom-columns='POD (REWRITTEN AT ADMISSION):.metadata.name,LIMITS:.spec.containers[0].resources.limits,CLAIM FROM TEMPLATE:.spec.resourceClaims[0].resourceClaimTemplateName'
go run ./cmd/fgpu gpus

step "fgpu measures the notebook (sizing Auto; a recommendation after 20 samples here) and reports"
for _ in $(seq 1 120); do
  [[ -n $($kubectl -n team-c get events --field-selector reason=FgpuSizingRecommendation -o name 2>/dev/null) ]] && break
  sleep 1
done
go run ./cmd/fgpu report --since 1h

step "Its next pod (a rollout; Auto makes one itself after its shrink window) gets its measured size"
$kubectl -n team-c rollout restart deploy/notebook >/dev/null
$kubectl -n team-c rollout status deploy/notebook --timeout 3m >/dev/null
$kubectl -n team-c get events --field-selector reason=FgpuSized -o custom-columns=SIZED:.message --no-headers | tail -1
go run ./cmd/fgpu gpus
sleep 10 # the new pod's first usage report (every 5 s here)
go run ./cmd/fgpu report --since 1h

step "What the 10Gi pod's container received (printed by fgpu-probe inside it)"
$kubectl logs -n team-a a-10gi | grep -v '^FGPU-PROBE'

step "What each GPU's MPS server was told (recorded by the fake backend's MPS stand-in)"
checkpoint=/var/lib/kubelet/plugins/gpu.fgpu.dev/checkpoint.json
for state in /var/run/fgpu/mps/*/log/fake-mps-state.json; do
  key=$(basename "$(dirname "$(dirname "$state")")")
  # The domain a daemon serves is in the plugin's checkpoint; a daemon started ahead as a GPU's
  # spare keeps its key once a namespace's first pod there took it, and one no namespace took
  # yet serves no one.
  domain=$(grep -o "\"isolationDomain\":\"[^\"]*\",\"mpsKey\":\"$key\"" "$checkpoint" 2>/dev/null | head -1 | cut -d'"' -f4 || true)
  echo "${domain:-(spare, no namespace yet)} [$key]: $(cat "$state")"
done

printf '\nThe cluster is still up: KUBECONFIG=%s %s get pods -A\n`make demo-down` tears it down.\n' "$KUBECONFIG" "$kubectl"
