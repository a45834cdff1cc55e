#!/usr/bin/env bash
# Runs the e2e suites on a fresh local cluster and always tears it down, also on failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

cleanup() {
  local rc=$?
  e2e/cluster/down.sh || rc=1
  rm -rf /var/run/fgpu
  exit $rc
}

hack/install-prereqs.sh
e2e/cluster/build.sh
# A cluster left by an interrupted run would make up.sh refuse.
e2e/cluster/down.sh >/dev/null 2>&1 || true
rm -rf /var/run/fgpu
trap cleanup EXIT
e2e/cluster/up.sh
# The e2e build carries the plugin's fault hooks (pkg/plugin/faults_e2e.go); demo and
# release images are built without them.
FGPU_BUILD_TAGS=fgpu_e2e e2e/cluster/images.sh fgpu
FGPU_E2E=1 go test -p 1 -count=1 -timeout 45m -v ./e2e/... 2>&1 | tee _output/e2e.log
