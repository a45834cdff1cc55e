#!/usr/bin/env bash
# Builds the local cluster's binaries into _output/bin from the Go module proxy, through the tool
# modules under e2e/tools (each pins its versions in its own go.mod, away from the driver's):
#   kubernetes: kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl (v1.37.2)
#   etcd:       etcd (v3.7.3)
#   containerd: containerd ctr containerd-shim-runc-v2 (v2.4.2)
#   helm:       helm (v3.21.4)
#   prometheus: prometheus (v0.316.0, i.e. Prometheus 3.x; the e2e checks the dashboard's queries)
#   kueue:      kueue (Kueue's manager, v0.19.2; only the e2e/kueue suite runs it)
# A group is skipped when all its binaries are newer than its go.mod and go.sum; --force rebuilds.
# --cluster-only builds what a cluster runs (kubernetes, etcd, containerd, helm): make demo
# needs no more, and prometheus and kueue are a third of a cold build.
# Cold: about 18 min on a loaded 2-core machine and ~6 GB of Go caches, plus kueue (about 6
# CPU-minutes, 1.9 GB peak RSS: 11.5 min wall on a 2-core machine shared with other builds);
# warm: under a minute.
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

FORCE=0
CLUSTER_ONLY=0
for a in "$@"; do
  case $a in
    --force|-f) FORCE=1 ;;
    --cluster-only) CLUSTER_ONLY=1 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) die "unknown argument $a (want --force or --cluster-only)" ;;
  esac
done

command -v go >/dev/null || die "no 'go' on PATH"
TOOLS=$REPO_ROOT/e2e/tools
mkdir -p "$BIN_DIR"
export CGO_ENABLED=0

# fresh GROUP BIN...: every BIN exists and is newer than the group's go.mod and go.sum.
fresh() {
  local dir=$TOOLS/$1; shift
  ((FORCE == 0)) || return 1
  local b
  for b in "$@"; do
    [[ -x $BIN_DIR/$b && $BIN_DIR/$b -nt $dir/go.sum && $BIN_DIR/$b -nt $dir/go.mod ]] || return 1
  done
}

build() { # GROUP DESC BIN... -- go build args...
  local group=$1; shift
  local bins=()
  while [[ $1 != -- ]]; do bins+=("$1"); shift; done
  shift
  if fresh "$group" "${bins[@]}"; then
    log "build: $group up to date (${bins[*]})"
    return
  fi
  log "build: $group (${bins[*]})"
  local t0=$SECONDS
  (cd "$TOOLS/$group" && go build -o "$BIN_DIR/" "$@") || die "build of $group failed"
  # go build leaves an up-to-date binary's mtime alone; touch so the freshness check holds.
  local b; for b in "${bins[@]}"; do touch "$BIN_DIR/$b"; done
  log "build: $group done in $((SECONDS - t0))s"
}

K8S_LDFLAGS="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
build kubernetes kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl -- \
  -ldflags "$K8S_LDFLAGS" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl

build etcd etcd -- .

build containerd containerd ctr -- -tags urfave_cli_no_docs \
  github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/ctr
# The shim is built on its own: no_grpc keeps it small, and it must sit on containerd's PATH.
build containerd containerd-shim-runc-v2 -- -tags urfave_cli_no_docs,no_grpc \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2

HELM_LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=v3.21.4"
for pkg in pkg/lint/rules pkg/chartutil; do
  HELM_LDFLAGS+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=37"
done
build helm helm -- -ldflags "$HELM_LDFLAGS" helm.sh/helm/v3/cmd/helm

if ((CLUSTER_ONLY)); then
  log "build: cluster binaries in $BIN_DIR (prometheus and kueue left out)"
  exit 0
fi

# Prometheus' own build tag remove_all_sd leaves out the service-discovery plugins (cloud SDKs,
# Kubernetes' client) but file and HTTP discovery: the e2e scrapes static targets, and the
# build takes a fraction of the full one's time. No web UI assets: the e2e uses the HTTP API.
PROM_LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=3.16.0"
build prometheus prometheus -- -tags remove_all_sd -ldflags "$PROM_LDFLAGS" github.com/prometheus/prometheus/cmd/prometheus
build kueue kueue -- -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=v0.19.2" \
  sigs.k8s.io/kueue/cmd/kueue

log "build: binaries in $BIN_DIR"
