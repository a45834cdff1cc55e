#!/usr/bin/env bash
# Stops the local cluster started by up.sh and removes everything it left on the host: processes
# (by recorded pid, then containerd shims and container processes of ours), mounts under the
# kubelet root, containerd's /run state and the state dir, network namespaces, kubepods cgroups,
# the kubelet's iptables chains, the CNI bridge, CNI leases, CDI specs created since up.sh, and the
# sysctls the kubelet and the bridge plugin changed. Safe to run after a failure, without a state
# dir, or twice in a row.
#
#   down.sh [--keep-logs]   --keep-logs copies the component logs to _output/cluster-logs/ first
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

KEEP_LOGS=0
for a in "$@"; do
  case $a in
    --keep-logs) KEEP_LOGS=1 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) die "unknown argument $a" ;;
  esac
done
require_root
lock_cluster
T0=$SECONDS

if ((KEEP_LOGS)) && [[ -d $STATE_DIR/logs ]]; then
  dest=$REPO_ROOT/_output/cluster-logs
  rm -rf "$dest" && mkdir -p "$dest" && cp -a "$STATE_DIR/logs/." "$dest/" 2>/dev/null || true
  log "down: logs kept in ${dest#"$REPO_ROOT"/}"
fi

# preexisted PATH: up.sh found PATH on the host already (then it is not ours to remove).
preexisted() { [[ -f $STATE_DIR/preexisting ]] && grep -qxF "$1" "$STATE_DIR/preexisting"; }

# stop_pids SIGNAL_WAIT_SECONDS PID...: TERM, wait, then KILL.
stop_pids() {
  local wait=$1; shift
  (($#)) || return 0
  kill -TERM "$@" 2>/dev/null || true
  local deadline=$((SECONDS + wait)) p alive
  while :; do
    alive=()
    for p in "$@"; do running "$p" && alive+=("$p"); done
    ((${#alive[@]})) || return 0
    ((SECONDS < deadline)) || break
    sleep 0.2
  done
  kill -KILL "${alive[@]}" 2>/dev/null || true
  sleep 0.3
}

# stop WAIT NAME...: the recorded processes of components NAME..., together, if they still run our
# binaries.
stop() {
  local wait=$1; shift
  local n pids=() names=()
  for n in "$@"; do
    if pid_alive "$n"; then pids+=("$(<"$STATE_DIR/pids/$n.pid")"); names+=("$n"); fi
  done
  if ((${#pids[@]})); then
    stop_pids "$wait" "${pids[@]}"
    log "down: stopped ${names[*]}"
  fi
  for n in "$@"; do rm -f "$STATE_DIR/pids/$n.pid"; done
}

# pids_of_exe PATH: processes running binary PATH.
pids_of_exe() {
  local d exe
  for d in /proc/[0-9]*; do
    exe=$(readlink "$d/exe" 2>/dev/null) || continue
    [[ $exe == "$1" || $exe == "$1 (deleted)" ]] && echo "${d#/proc/}"
  done
}

# kubepods_pids: every process in a kubepods cgroup (the containers' processes).
kubepods_pids() {
  find /sys/fs/cgroup/*/kubepods* -name cgroup.procs 2>/dev/null | xargs -r cat 2>/dev/null | sort -u
}

# 1. The kubelet first, so nothing restarts containers; then the control plane's clients.
stop 10 kubelet
stop 5 kube-scheduler kube-controller-manager

# 2. Containers: runc's own delete kills them and removes their cgroups; then the shims, then
#    anything still in a kubepods cgroup.
for root in /run/containerd/runc/*; do
  [[ -d $root ]] || continue
  for id in $(runc --root "$root" list -q 2>/dev/null); do
    runc --root "$root" delete --force "$id" >/dev/null 2>&1 || true
  done
done
stop 10 containerd
mapfile -t shims < <(pids_of_exe "$BIN_DIR/containerd-shim-runc-v2")
if ((${#shims[@]})); then
  stop_pids 3 "${shims[@]}"
  log "down: stopped ${#shims[@]} containerd shim(s)"
fi
for _ in 1 2 3; do
  mapfile -t left < <(kubepods_pids)
  ((${#left[@]})) || break
  log "down: killing ${#left[@]} leftover container process(es)"
  kill -KILL "${left[@]}" 2>/dev/null || true
  sleep 0.5
done

# 3. The control plane.
stop 10 kube-apiserver
stop 10 etcd

# 4. Mounts: pod volumes under the kubelet root, containerd's rootfs/shm mounts under /run and the
#    state dir, fgpu's state dir (up.sh's shared bind and the MPS servers' shm), and the CNI
#    network namespaces. Deepest first; lazily if busy.
unmount_under() {
  local prefix=$1 m
  # /proc/self/mountinfo field 5 is the mount point (octal-escaped spaces are rare enough here).
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "down: WARNING: cannot unmount $m"
  done < <(awk -v p="$prefix" '$5 == p || index($5, p "/") == 1 {print $5}' /proc/self/mountinfo | sort -r -u)
}
for prefix in "$KUBELET_ROOT" /run/containerd /var/run/containerd "$STATE_DIR" "$FGPU_STATE_DIR"; do
  unmount_under "$prefix"
done
for ns in /run/netns/cni-*; do
  [[ -e $ns ]] || continue
  umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
  rm -f "$ns"
done

# 5. cgroups the kubelet made (cgroupfs driver), in every v1 hierarchy and in the unified one.
for _ in 1 2 3 4 5; do
  mapfile -t cg < <(find /sys/fs/cgroup -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null)
  ((${#cg[@]})) || break
  find "${cg[@]}" -depth -type d -exec rmdir {} + 2>/dev/null || true
  sleep 0.3
done
if [[ -n $(find /sys/fs/cgroup -maxdepth 2 -type d -name 'kubepods*' 2>/dev/null) ]]; then
  log "down: WARNING: kubepods cgroups remain: $(find /sys/fs/cgroup -maxdepth 2 -type d -name 'kubepods*' | tr '\n' ' ')"
fi

# 6. iptables: the kubelet's chains (KUBE-FIREWALL, KUBE-*-CANARY, KUBE-IPTABLES-HINT, ...) and any
#    CNI-* chains, with the rules that jump to them, in both families and every table.
clean_iptables() {
  local save=$1 restore=$2 dump
  command -v "$save" >/dev/null || return 0
  dump=$("$save" 2>/dev/null) || return 0
  [[ -n $dump ]] || return 0
  local script
  script=$(awk '
    /^\*/ { table=$0; n=0; m=0; next }
    /^:(KUBE-|CNI-)/ { c=substr($1,2); chains[++n]=c; next }
    /^-A / {
      # a rule in someone else'"'"'s chain that jumps to one of ours
      if ($2 !~ /^(KUBE-|CNI-)/ && $0 ~ / -[jg] (KUBE-|CNI-)/) { r=$0; sub(/^-A /, "-D ", r); rules[++m]=r }
      next
    }
    /^COMMIT/ {
      if (n || m) {
        print table
        for (i=1;i<=m;i++) print rules[i]
        for (i=1;i<=n;i++) print "-F " chains[i]
        for (i=1;i<=n;i++) print "-X " chains[i]
        print "COMMIT"
      }
      n=0; m=0
    }' <<<"$dump")
  [[ -n $script ]] || return 0
  if "$restore" --noflush <<<"$script" 2>/dev/null; then
    log "down: removed KUBE-/CNI- chains ($save)"
  else
    log "down: WARNING: $restore failed on:"$'\n'"$script"
  fi
}
clean_iptables iptables-save iptables-restore
clean_iptables ip6tables-save ip6tables-restore

# 7. The CNI bridge (the veths went with their namespaces).
if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
  ip link delete "$CNI_BRIDGE" && log "down: deleted bridge $CNI_BRIDGE"
fi

# 8. sysctls back to what up.sh found.
if [[ -f $STATE_DIR/sysctl.saved ]]; then
  while IFS= read -r kv; do
    [[ $(sysctl -n "${kv%%=*}" 2>/dev/null) == "${kv#*=}" ]] || sysctl -q -w "$kv" 2>/dev/null || true
  done <"$STATE_DIR/sysctl.saved"
fi

# 9. Files: CDI specs created while the cluster ran, CNI caches and leases, the kubelet root,
#    containerd's /run state, and the host dirs that did not exist before up.sh.
if [[ -f $STATE_DIR/preexisting ]]; then
  for d in /etc/cdi /var/run/cdi; do
    [[ -d $d ]] || continue
    for f in "$d"/* "$d"/.[!.]*; do
      [[ -e $f ]] || continue
      preexisted "$f" || rm -rf "$f"
    done
  done
fi
rm -rf /var/lib/cni/networks/"$CNI_NETWORK" /var/lib/cni/results/"$CNI_NETWORK"-* 2>/dev/null || true
# Without up.sh's record (state dir gone) only what is certainly ours goes: the kubelet root,
# containerd's /run state (when no containerd runs) and empty kubelet log dirs.
have_record=0
[[ -f $STATE_DIR/preexisting ]] && have_record=1
containerd_running=0
[[ -n $(pids_of_exe "$BIN_DIR/containerd") ]] && containerd_running=1
pgrep -x containerd >/dev/null 2>&1 && containerd_running=1
for p in "${HOST_PATHS[@]}"; do
  [[ -e $p ]] || continue
  preexisted "$p" && continue
  case $p in
    "$KUBELET_ROOT") rm -rf "$p" 2>/dev/null || log "down: WARNING: cannot remove $p (still mounted?)" ;;
    /run/containerd) ((containerd_running)) || rm -rf "$p" ;;
    /run/netns | /run/mount) rmdir "$p" 2>/dev/null || true ;; # shared with others: only if empty
    *)
      if ((have_record)); then
        rm -rf "$p"
      else
        find "$p" -xtype l -delete 2>/dev/null || true
        find "$p" -depth -type d -empty -delete 2>/dev/null || true
      fi
      ;;
  esac
done

# 10. The state dir last (mounts are gone).
if [[ -d $STATE_DIR ]]; then
  unmount_under "$STATE_DIR"
  rm -rf "$STATE_DIR" || die "cannot remove $STATE_DIR"
fi
log "down: clean in $((SECONDS - T0))s"
