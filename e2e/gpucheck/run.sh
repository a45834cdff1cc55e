#!/usr/bin/env bash
# The real-GPU check of fgpu's node side, for the device machine: NVML lists the GPU, the
# plugin prepares two claims (10Gi, 20Gi) with the real MPS daemon, and two CUDA processes
# started with the injected environment find their limits enforced. Usage: run.sh GPUCHECK_BIN OUTDIR
set -uo pipefail
bin=$1 out=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
export PATH=$PATH:/usr/local/nvidia/bin
export LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}:/usr/local/nvidia/lib64:/usr/local/nvidia/lib
nvidia-smi -L
command -v nvidia-cuda-mps-control || { echo "no nvidia-cuda-mps-control on this machine"; exit 1; }
"$bin" prepare "$out/env" || exit 1
# Live MPS processes (an exited daemon lingers as a zombie until the VM's init reaps it).
mps_procs() { ps -eo pid,stat,args | awk '$2 !~ /^Z/' | grep '[n]vidia-cuda-mps'; }
echo "MPS daemons running:"; mps_procs || true
pids=()
for c in a b; do
  ( set -a; . "$out/env/claim-$c.env"; set +a; exec python3 "$here/alloc.py" "$c" ) &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "MPS server list:"; ( set -a; . "$out/env/claim-a.env"; set +a; echo get_server_list | nvidia-cuda-mps-control )
"$bin" unprepare || rc=1
sleep 1
mps_procs && { echo "MPS daemon left running"; rc=1; }
echo "gpucheck rc=$rc"
exit $rc
