#!/usr/bin/env bash
# The demo on kind, for machines with Docker: builds the fgpu image from the project's static
# binaries (no Dockerfile, no registry), loads it into kind, installs the chart with two fake
# 80Gi GPUs per worker and runs the demo pods. Needs: docker, kind, go.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"
cluster=${KIND_CLUSTER:-fgpu}
image=${KIND_NODE_IMAGE:-kindest/node:v1.36.0}

if ! kind get clusters | grep -qx "$cluster"; then
  kind create cluster --name "$cluster" --image "$image" --config demo/kind/kind-config.yaml
fi
e2e/cluster/images.sh --no-import fgpu
kind load image-archive --name "$cluster" _output/images/fgpu.tar
helm=${HELM:-helm}
command -v "$helm" >/dev/null || { e2e/cluster/build.sh; helm=_output/bin/helm; }
"$helm" upgrade --install fgpu deployments/helm/fgpu -n fgpu-system --create-namespace \
  -f deployments/helm/fgpu/values-fake.yaml --set image.pullPolicy=Never --set allocationMode=allocator \
  --set allocator.defaultPolicy.spec.allowSharedGPU=true --wait
kubectl apply -f demo/specs/00-namespaces.yaml -f demo/specs/01-policies.yaml
# Pods arrive one by one, as in `make demo`.
for f in demo/specs/1*.yaml; do
  kubectl apply -f "$f"
  ns=$(awk '/namespace:/ {print $2; exit}' "$f")
  kubectl wait -n "$ns" --for=condition=Ready pod -l app.kubernetes.io/part-of=fgpu-demo --timeout=3m
done
go run ./cmd/fgpu gpus
kubectl logs -n team-a a-10gi | grep -v '^FGPU-PROBE'
echo "Delete with: kind delete cluster --name $cluster"
