#!/usr/bin/env bash
# The faults check (docs/faults.md, "The check on a GPU"): `gpucheck faults` runs the plugin's
# health watch and MPS check while a normal workload runs (no fault may be reported), then
# while one MPS client makes an illegal memory access beside another, and prints what it saw
# (SEEN:). This script prepares its state directory and leaves nothing behind.
#
# Usage: faults.sh [--fake] GPUCHECK_BIN OUTDIR
#   real GPU: needs the driver, nvidia-cuda-mps-control, python3 with PyTorch; root. About 4 min.
#   --fake:   fake GPUs and the MPS stand-in (fake-mps-control next to GPUCHECK_BIN); root.
set -uo pipefail
fake=0
if [ "${1:-}" = --fake ]; then fake=1; shift; fi
bin=$(realpath "$1") out=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out"
# A short state directory: MPS control sockets are created under it (107 bytes at most).
out=$(realpath "$out") root=$(mktemp -d /tmp/gpucheck.XXXXXX)
ln -s "$root" "$out/state"
# A tenant killed as it hangs leaves its (empty) root directory in TMPDIR: here, in the state.
export TMPDIR=$root
export PATH=$(dirname "$bin"):$PATH
if [ $fake = 1 ]; then
  g=("$bin" --gpus fake:1xH100-80GB --root "$root") timing=(--quiet 3s --poll 200ms)
else
  export PATH=$PATH:/usr/local/nvidia/bin
  nvidia-smi -L || exit 1
  command -v nvidia-cuda-mps-control || { echo "no nvidia-cuda-mps-control on this machine"; exit 1; }
  g=("$bin" --gpus nvml --root "$root") timing=(--quiet 2m --poll 2s)
fi
"${g[@]}" faults --check-dir "$here" "${timing[@]}" "$out/run" 2>&1 | tee "$out/faults.log"
rc=${PIPESTATUS[0]}
# gpucheck faults unprepares its claims; should it have died before, the plugin's own
# unprepare stops the daemons now.
[ $rc = 0 ] || "${g[@]}" unprepare > "$out/unprepare.log" 2>&1 || echo "unprepare: $(tail -1 "$out/unprepare.log")"
grep -q " $root/" /proc/self/mountinfo && { echo "FAIL: a mount under $root is left"; rc=1; }
# A failed check keeps its state ($out/state links to it) for a person to read.
[ $rc = 0 ] && rm -rf "$root" "$out/state"
echo "gpucheck faults rc=$rc"
exit $rc
