# Shared settings and helpers of the local-cluster scripts; sourced, not run.
# shellcheck shell=bash

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BIN_DIR=$REPO_ROOT/_output/bin
# The state dir holds everything the cluster writes that is ours alone: certificates, configs,
# etcd's data, containerd's root and socket, logs, pid files. down.sh removes it.
STATE_DIR=${FGPU_CLUSTER_DIR:-$REPO_ROOT/_output/cluster}
# Absolute, always: ctr takes a relative socket path for a URL ("invalid (non-empty) authority").
[[ $STATE_DIR == /* ]] || STATE_DIR=$PWD/$STATE_DIR
IMAGES_DIR=$REPO_ROOT/_output/images
KUBECONFIG_FILE=$STATE_DIR/kubeconfig
CONTAINERD_SOCK=$STATE_DIR/containerd/containerd.sock
KUBELET_ROOT=/var/lib/kubelet
K8S_VERSION=v1.37.2
PAUSE_IMAGE=fgpu.dev/pause:dev
CNI_NETWORK=fgpu-local
CNI_BRIDGE=cni-fgpu0
POD_CIDR=${FGPU_POD_CIDR:-10.244.0.0/24}
SERVICE_CIDR=10.96.0.0/16
# Components run with the defaults of 1.37 (DRA GA, consumable capacity beta, device taints GA)
# unless FGPU_FEATURE_GATES adds some, e.g. "DRAFractionalCapacityRange=true". Enabling gates
# whose APIs the API server does not serve can hang the scheduler (see README).
FEATURE_GATES=${FGPU_FEATURE_GATES:-}
# Extra --runtime-config of the API server, e.g. "resource.k8s.io/v1beta2=true".
RUNTIME_CONFIG=${FGPU_RUNTIME_CONFIG:-}

# Host paths outside the state dir that the cluster creates; down.sh removes the ones that did not
# exist before up.sh (recorded in $STATE_DIR/preexisting).
# FGPU_STATE_DIR is fgpu's node directory (the chart's kubeletPlugin.stateDir), made a shared
# mount by up.sh: the plugin's hostPath of it uses Bidirectional mount propagation.
FGPU_STATE_DIR=/run/fgpu
HOST_PATHS=(/var/lib/kubelet /var/log/pods /var/log/containers /run/containerd /run/netns
  /etc/cdi /var/run/cdi /var/lib/cni /var/lib/cni/networks /var/lib/cni/results /run/nri /run/mount)

# running PID: the process exists and is not a zombie (an exited process lingers as one until
# its parent, often PID 1, reaps it, which can take a second).
running() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $st && $st != Z && $st != X ]]
}

log() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# lock_cluster: up.sh and down.sh of one state dir run one at a time (others on the machine may
# share the tree); a nested call (up.sh running down.sh) inherits the lock.
lock_cluster() {
  [[ ${FGPU_CLUSTER_LOCKED:-} == "$STATE_DIR" ]] && return 0
  mkdir -p "$(dirname "$STATE_DIR")"
  exec 9>"$STATE_DIR.lock"
  if ! flock -n 9; then
    log "another up.sh/down.sh holds $STATE_DIR.lock; waiting"
    flock 9
  fi
  export FGPU_CLUSTER_LOCKED=$STATE_DIR
}

require_root() { [[ $(id -u) -eq 0 ]] || die "must run as root"; }

# node_ip prints the IPv4 address the kubelet registers and serves on: FGPU_NODE_IP, else eth0's,
# else the interface of the default route. The kubelet refuses a loopback node IP.
node_ip() {
  if [[ -n ${FGPU_NODE_IP:-} ]]; then echo "$FGPU_NODE_IP"; return; fi
  local ifc=${FGPU_NODE_IFACE:-eth0} ip
  ip=$(ip -4 -o addr show dev "$ifc" 2>/dev/null | awk '{split($4,a,"/"); print a[1]; exit}')
  if [[ -z $ip ]]; then
    ifc=$(ip -4 route show default 2>/dev/null | awk '{for(i=1;i<NF;i++) if($i=="dev"){print $(i+1); exit}}')
    [[ -n $ifc ]] && ip=$(ip -4 -o addr show dev "$ifc" | awk '{split($4,a,"/"); print a[1]; exit}')
  fi
  [[ -n $ip ]] || die "cannot find the node IP (no eth0, no default route); set FGPU_NODE_IP"
  echo "$ip"
}

node_name() {
  local n=${FGPU_NODE_NAME:-$(hostname)}
  n=$(tr 'A-Z_' 'a-z-' <<<"$n")
  echo "${n%%.*}"
}

# pid_alive NAME: the recorded process of component NAME is still running that binary.
pid_alive() {
  local f=$STATE_DIR/pids/$1.pid pid
  [[ -f $f ]] || return 1
  pid=$(<"$f")
  [[ -n $pid ]] && running "$pid" || return 1
  # Guard against a recycled pid: the process must still run the binary we started.
  local exe
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  [[ $exe == "$BIN_DIR/$1" || $exe == "$BIN_DIR/$1 (deleted)" ]]
}

# start NAME ARGS...: runs $BIN_DIR/NAME in the background, logging to $STATE_DIR/logs/NAME.log,
# detached from this shell's session so it outlives the script, and records its pid.
start() {
  local name=$1; shift
  mkdir -p "$STATE_DIR/logs" "$STATE_DIR/pids"
  # 9>&-: the cluster lock (lock_cluster) must not be inherited by long-running processes.
  PATH=$BIN_DIR:$PATH setsid "$BIN_DIR/$name" "$@" </dev/null >>"$STATE_DIR/logs/$name.log" 2>&1 9>&- &
  echo $! >"$STATE_DIR/pids/$name.pid"
  log "started $name (pid $!)"
}

# wait_for DESC TIMEOUT CMD...: polls CMD until it succeeds.
wait_for() {
  local desc=$1 timeout=$2; shift 2
  local deadline=$((SECONDS + timeout))
  local f
  until "$@" >/dev/null 2>&1; do
    # Fail fast when a component we started has exited.
    for f in "$STATE_DIR"/pids/*.pid; do
      [[ -f $f ]] || continue
      f=${f##*/}; f=${f%.pid}
      if ! pid_alive "$f"; then
        log "$f exited while waiting for $desc (see $STATE_DIR/logs/$f.log)"
        return 1
      fi
    done
    if ((SECONDS >= deadline)); then
      log "timed out after ${timeout}s waiting for $desc"
      return 1
    fi
    sleep 0.3
  done
}

# The scripts' own kubectl calls cache discovery in the state dir, not in ~/.kube.
kubectl_() { "$BIN_DIR/kubectl" --kubeconfig "$KUBECONFIG_FILE" --cache-dir "$STATE_DIR/kube-cache" "$@"; }
ctr_() { "$BIN_DIR/ctr" --address "$CONTAINERD_SOCK" "$@"; }
