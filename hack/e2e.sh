#!/usr/bin/env bash
# Runs the e2e suites on a fresh local cluster and always tears it down, also on failure.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Each phase's time goes to _output/e2e-phases.txt (hack/test.sh prints it), the suites' from
# go test's own lines.
phases=_output/e2e-phases.txt
mkdir -p _output
: >"$phases"
timed() { # NAME COMMAND...
  local name=$1 t0=$SECONDS rc=0
  shift
  "$@" || rc=$?
  printf '%-20s %5ds\n' "$name" $((SECONDS - t0)) >>"$phases"
  return $rc
}

cleanup() {
  local rc=$?
  if [[ -f _output/e2e.log ]]; then
    sed -nE 's#^(ok|FAIL)[[:space:]]+github.com/fgpu-dev/fgpu/(e2e/[^[:space:]]+)[[:space:]]+([0-9]+)\.[0-9]+s.*#\2 \3 \1#p' _output/e2e.log |
      while read -r suite secs result; do printf '%-20s %5ds%s\n' "$suite" "$secs" "$([[ $result == ok ]] || echo '  FAILED')"; done >>"$phases"
  fi
  timed cluster-down e2e/cluster/down.sh || rc=1
  rm -rf /var/run/fgpu
  exit $rc
}

timed prereqs hack/install-prereqs.sh
timed cluster-binaries e2e/cluster/build.sh
# A cluster left by an interrupted run would make up.sh refuse.
e2e/cluster/down.sh >/dev/null 2>&1 || true
rm -rf /var/run/fgpu
rm -f _output/e2e.log
trap cleanup EXIT
timed cluster-up e2e/cluster/up.sh
# The e2e build carries the plugin's fault hooks (pkg/plugin/faults_e2e.go); demo and
# release images are built without them.
timed images env FGPU_BUILD_TAGS=fgpu_e2e e2e/cluster/images.sh fgpu
FGPU_E2E=1 go test -p 1 -count=1 -timeout 45m -v ./e2e/... 2>&1 | tee _output/e2e.log
