#!/bin/sh
# The fake-GPU variant's MPS client of the faults check, in place of cuda_client.py, with the
# same modes and lines ("<unix time> <event> <detail>"). Fake GPUs run no kernels: a step is
# asking its server's state (fake-mps-control), which the check puts into FAULT, as NVIDIA's
# server goes after a client's fatal fault, when client A "launches".
mode=$1
say() { echo "$(date +%s.%N | cut -c1-14) $*"; }
status() {
  pid=$(echo get_server_list | fake-mps-control) || { echo "no control daemon"; return; }
  [ -n "$pid" ] || { echo "no server"; return; }
  echo "get_server_status $pid" | fake-mps-control
}
# loop and illegal run until their stdin closes, which a background reader notes in /tmp
# (the tenant's own).
watch_stdin() { exec 3<&0; ( cat <&3 >/dev/null; touch /tmp/stdin-closed ) & }
case $mode in
probe)
  s=$(status)
  [ "$s" = FAULT ] && { say error "probe its MPS server is in FAULT: refused (stand-in)"; exit 1; }
  say ok "probe (server: $s)" ;;
loop)
  watch_stdin; say ready; n=0
  while [ ! -e /tmp/stdin-closed ]; do
    n=$((n + 1)); s=$(status)
    if [ "$s" = ACTIVE ]; then say ok "step $n"; else say error "step $n its MPS server: $s (stand-in)"; fi
    sleep 0.2
  done ;;
illegal)
  watch_stdin; say ready; say launch
  for _ in $(seq 50); do [ "$(status)" = FAULT ] && break; sleep 0.2; done
  if [ "$(status)" = FAULT ]; then say fault "its MPS server is in FAULT (stand-in for CUDA_ERROR_ILLEGAL_ADDRESS)"; else say nofault "its MPS server: $(status)"; fi
  while [ ! -e /tmp/stdin-closed ]; do sleep 0.2; done ;;
esac
