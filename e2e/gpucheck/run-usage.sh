#!/usr/bin/env bash
# The usage check, where a GPU is at hand (issue 13): the kubelet plugin (plugin.Start, its
# own usage meter) measures two PyTorch tenants of GPU 0 under one MPS server, each run as a
# container of its claim's CDI spec in a cgroup named like its pod's; every poll its per-claim
# memory and SM activity are compared with nvidia-smi's (--query-compute-apps, pmon); the
# summaries it writes into the claims' status feed the allocator's recommender, whose memory
# for each must be above the peak nvidia-smi saw. About 4 minutes on a GPU.
#
# Usage: run-usage.sh [--fake] GPUCHECK_BIN OUTDIR
#   real GPU: the driver, nvidia-cuda-mps-control, nvidia-smi, python3 with PyTorch; root.
#   --fake:   fake GPUs, the MPS stand-in, fgpu-probe replaying the same patterns into the
#             fake GPU's usage file, which stands in for nvidia-smi (in make test; ~40 s).
set -uo pipefail
fake=0
if [ "${1:-}" = --fake ]; then fake=1; shift; fi
bin=$(realpath "$1") out=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out"
# MPS control sockets live under the state directory: keep its path short.
out=$(realpath "$out") root=$(mktemp -d /tmp/gpucheck-usage.XXXXXX)
ln -s "$root" "$out/state"
export PATH=$(dirname "$bin"):$PATH
if [ $fake = 1 ]; then
  g=("$bin" --gpus fake:1xH100-80GB --root "$root")
  args=(--duration "${USAGE_DURATION:-30s}" --poll 250ms --report 3s --min-samples 20 --host-pid
    --bind "$here:/check" --bind "$(dirname "$bin")/fake-mps-control:/usr/local/bin/fake-mps-control"
    --bind "$(dirname "$bin")/fgpu-probe:/usr/local/bin/fgpu-probe" --bind "$root/fake-dev:/fake-dev:rw"
    "$out" /bin/sh /check/fake-usage-tenant.sh)
  daemon_pat='[f]ake-mps-control'
else
  export PATH=$PATH:/usr/local/nvidia/bin
  nvidia-smi -L || exit 1
  command -v nvidia-cuda-mps-control >/dev/null || { echo "no nvidia-cuda-mps-control on this machine"; exit 1; }
  python3 -c 'import torch' || { echo "no PyTorch for python3 on this machine"; exit 1; }
  g=("$bin" --gpus nvml --root "$root")
  args=(--duration "${USAGE_DURATION:-180s}" --bind "$here:/check" "$out" python3 /check/usage.py)
  daemon_pat='[n]vidia-cuda-mps'
fi
rc=0
"${g[@]}" usage "${args[@]}" 2>&1 | tee "$out/usage.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
for f in $(ls "$out"/tenant-*.log 2>/dev/null); do echo "== $(basename "$f")"; tail -5 "$f"; done

echo "== nothing left behind"
sleep 1
left=$(ps -eo pid,stat,args | awk '$2 !~ /^Z/' | grep -- "$daemon_pat" | while read -r pid _; do
  tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q "^CUDA_MPS_PIPE_DIRECTORY=$root/" && echo "$pid"
done)
[ -n "$left" ] && { echo "FAIL: MPS daemons left running: $left"; rc=1; }
grep -q " $root/" /proc/self/mountinfo && { echo "FAIL: a mount under $root is left"; rc=1; }
ls -d /sys/fs/cgroup/fgpu-usagecheck-* /sys/fs/cgroup/*/fgpu-usagecheck-* 2>/dev/null | grep "$(basename "$root")" && { echo "FAIL: a cgroup is left"; rc=1; }
# A failed check keeps its state ($out/state links to it) for a person to read.
[ $rc = 0 ] && rm -rf "$root" "$out/state"
echo "gpucheck-usage rc=$rc"
exit $rc
