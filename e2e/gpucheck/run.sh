#!/usr/bin/env bash
# The GPU check in production shape, without Kubernetes. The plugin's own code prepares two
# claims of two namespaces on GPU 0 (one MPS daemon each, started as the DaemonSet starts
# them); each tenant runs as a container would (gpucheck tenant: own PID, mount, IPC and UTS
# namespaces, only the CDI spec's devices, mounts and environment, the host's driver hidden).
# While they run, the plugin is killed and started again: it must find both daemons with
# their PIDs unchanged, reuse one for a third claim, and the tenants must go on. A tenant of
# one namespace must see neither the other's pipe directory nor its shm. Unprepare must leave
# nothing behind.
#
# Usage: run.sh [--fake] GPUCHECK_BIN OUTDIR
#   real GPU: needs the driver, nvidia-cuda-mps-control, python3 with PyTorch; root.
#   --fake:   fake GPUs and the MPS stand-in (fake-mps-control next to GPUCHECK_BIN); root.
set -uo pipefail
fake=0
if [ "${1:-}" = --fake ]; then fake=1; shift; fi
bin=$(realpath "$1") out=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out"; mkdir -p "$out/run"
# The state lives in a short directory whatever the checkout's depth: MPS control sockets
# are created under it, and a unix socket path holds at most 107 bytes.
out=$(realpath "$out") run=$out/run root=$(mktemp -d /tmp/gpucheck.XXXXXX)
ln -s "$root" "$out/state"
export PATH=$(dirname "$bin"):$PATH
if [ $fake = 1 ]; then
  g=("$bin" --gpus fake:1xH100-80GB --root "$root")
  workload=(/bin/sh /check/fake-tenant.sh) binds=(--bind "$here:/check" --bind "$(dirname "$bin")/fake-mps-control:/usr/local/bin/fake-mps-control")
  daemon_pat='[f]ake-mps-control'
else
  export PATH=$PATH:/usr/local/nvidia/bin
  nvidia-smi -L || exit 1
  command -v nvidia-cuda-mps-control || { echo "no nvidia-cuda-mps-control on this machine"; exit 1; }
  g=("$bin" --gpus nvml --root "$root")
  workload=(python3 /check/alloc.py) binds=(--bind "$here:/check")
  daemon_pat='[n]vidia-cuda-mps'
fi
rc=0
fail() { echo "FAIL: $*"; rc=1; }
# This check's live MPS daemons: those whose pipe directory is under its state directory.
live_daemons() {
  ps -eo pid,stat,args | awk '$2 !~ /^Z/' | grep -- "$daemon_pat" | while read -r pid _; do
    tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -q "^CUDA_MPS_PIPE_DIRECTORY=$root/" && ps -o pid=,args= -p "$pid"
  done | grep .
}
wait_for() { # FILE PATTERN SECONDS
  for _ in $(seq "$3"); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 1; done; return 1
}
tenant() { # NAME CLAIM: runs the workload as a tenant of CLAIM, stdin from $run/go-NAME
  "${g[@]}" tenant --cdi-dir "$root/cdi" --devices "$(cat "$run/claim-$2.devices")" "${binds[@]}" \
    -- "${workload[@]}" "$1" < "$run/go-$1" > "$out/tenant-$1.log" 2>&1
}

echo "== the plugin prepares claims a (team-a) and b (team-b)"
"${g[@]}" plugin "$run" > "$out/plugin-1.log" 2>&1 & plugin=$!
for _ in $(seq 60); do [ -e "$run/ready" ] && break; sleep 1; done
[ -e "$run/ready" ] || { cat "$out/plugin-1.log"; echo "gpucheck rc=1"; exit 1; }
grep -E "^(GPU|prepared|MPS)" "$out/plugin-1.log"
echo "MPS daemons running:"; live_daemons

echo "== tenants a and b start"
pids=()
for t in a b; do
  mkfifo "$run/go-$t"
  tenant "$t" "$t" & pids+=($!)
done
exec 7>"$run/go-a" 8>"$run/go-b"
for t in a b; do wait_for "$out/tenant-$t.log" "phase 1 ok" 120 || fail "tenant $t did not finish phase 1"; cat "$out/tenant-$t.log"; done

echo "== each daemon's /dev/shm is its tenants' (a size-limited tmpfs)"
while read -r key pid; do
  shm=$root/mps/$key/shm
  echo "$key: daemon $pid sees in /dev/shm: $(ls "/proc/$pid/root/dev/shm" | tr '\n' ' ')($(df -h --output=fstype,size "$shm" | tail -1 | tr -s ' '))"
  [ "$(stat -c %d "/proc/$pid/root/dev/shm")" = "$(stat -c %d "$shm")" ] || fail "daemon $key's /dev/shm is not its clients' shm directory"
done < "$run/daemons"
ls "/proc/$(awk '/^team-a/{print $2}' "$run/daemons")/root/dev/shm" | grep -q tenant-a || fail "team-a's daemon does not see its tenant's shm file"

echo "== the plugin is killed (SIGKILL) and started again while they run"
kill -9 "$plugin"; wait "$plugin" 2>/dev/null
"${g[@]}" restart "$run" > "$out/plugin-2.log" 2>&1 || fail "the restarted plugin: $(tail -1 "$out/plugin-2.log")"
grep -E "^(after|prepared|claim a2 reused)" "$out/plugin-2.log"

echo "== tenant a2 (team-a, prepared by the restarted plugin) runs beside a"
mkfifo "$run/go-a2"; ( exec 9>"$run/go-a2"; echo go >&9 ) &
tenant a2 a2 || fail "tenant a2"; cat "$out/tenant-a2.log"

echo "== tenants a and b go on"
echo go >&7; echo go >&8; exec 7>&- 8>&-
for i in 0 1; do wait "${pids[$i]}" || fail "tenant ${pids[$i]} exited non-zero"; done
cat "$out/tenant-a.log" "$out/tenant-b.log" | grep -E "phase 2|FAIL" || true

echo "== a tenant of team-b sees neither team-a's pipe directory nor its shm"
a_pipe=$(sed -n 's/^CUDA_MPS_PIPE_DIRECTORY=//p' "$run/claim-a.env")
a_shm=$(dirname "$a_pipe")/shm
echo "team-a's shm holds: $(ls "$a_shm" | tr '\n' ' ')"
mkfifo "$run/go-peek"; ( exec 9>"$run/go-peek" ) &
"${g[@]}" tenant --cdi-dir "$root/cdi" --devices "$(cat "$run/claim-b.devices")" -- /bin/sh -c \
  "ls -d '$a_pipe' 2>/dev/null && echo 'SEES team-a pipe directory'; for f in \$(ls /dev/shm); do [ -e '$a_shm'/\$f ] && echo \"SEES team-a shm file \$f\"; done; echo \"team-b's /dev/shm: \$(ls /dev/shm | tr '\n' ' ')\"" \
  < "$run/go-peek" > "$out/peek.log" 2>&1
cat "$out/peek.log"; grep -q SEES "$out/peek.log" && fail "team-b reaches team-a's MPS directories"
ls "$a_shm" | grep -q . || fail "team-a's shm directory is empty: the tenant's /dev/shm is not its daemon's"

if [ $fake = 0 ]; then
  echo "== nvidia-smi with only the CDI spec's driver"
  mkfifo "$run/go-smi"; ( exec 9>"$run/go-smi" ) &
  "${g[@]}" tenant --cdi-dir "$root/cdi" --devices "$(cat "$run/claim-a.devices")" -- nvidia-smi -L < "$run/go-smi" || fail "nvidia-smi in a tenant"
fi

echo "== unprepare"
"${g[@]}" unprepare || fail "unprepare"
sleep 1
live_daemons && fail "an MPS daemon is left running"
grep -q " $root/" /proc/self/mountinfo && fail "a mount under $root is left: $(grep " $root/" /proc/self/mountinfo)"
# A failed check keeps its state ($out/state links to it) for a person to read.
[ $rc = 0 ] && rm -rf "$root" "$out/state"
echo "gpucheck rc=$rc"
exit $rc
