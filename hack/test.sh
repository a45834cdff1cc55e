#!/usr/bin/env bash
# make test: the phases in order, stopping at the first that fails, then how long each took
# (also after a failure), the e2e phase broken down by hack/e2e.sh: where the time goes on a
# cold machine is what decides whether CI stays within its limit.
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
MAKE=${MAKE:-make}
phases=(verify lint test-unit fuzz gpucheck-fake gpucheck-faults-fake gpucheck-usage-fake test-e2e)
rm -f _output/e2e-phases.txt
declare -a done_=()
rc=0
start=$SECONDS
for p in "${phases[@]}"; do
  t0=$SECONDS
  $MAKE --no-print-directory "$p" || rc=$?
  done_+=("$(printf '%-22s %5ds' "$p" $((SECONDS - t0)))")
  ((rc == 0)) || { done_[-1]+="  FAILED"; break; }
done
echo
echo "make test: time per phase"
printf '  %s\n' "${done_[@]}"
if [[ -s _output/e2e-phases.txt ]]; then
  echo "  test-e2e in detail:"
  sed 's/^/    /' _output/e2e-phases.txt
fi
printf '  %-22s %5ds\n' total $((SECONDS - start))
exit $rc
