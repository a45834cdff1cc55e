#!/usr/bin/env bash
# Starts a real single-node Kubernetes v1.37.2 on this machine as host processes: etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, containerd 2.x (+ runc, CNI bridge) and
# the kubelet. Everything the cluster owns lives in the state dir (_output/cluster: certificates,
# configs, etcd data, containerd root and socket, logs, pids); the admin kubeconfig is
# _output/cluster/kubeconfig. Waits until the node is Ready and the default service account exists.
#
# Needs root, the binaries from e2e/cluster/build.sh and the packages from hack/install-prereqs.sh.
# If a cluster is already fully up it says so and exits 0; a half-up one is torn down first.
# On failure it prints the failing component's log, keeps the logs in _output/cluster-logs and
# tears everything down (FGPU_KEEP_ON_FAILURE=1 leaves the processes running for debugging).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

T0=$(date +%s.%N)
require_root
lock_cluster

# ---------------------------------------------------------------- preflight
for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl containerd ctr containerd-shim-runc-v2; do
  [[ -x $BIN_DIR/$b ]] || die "missing $BIN_DIR/$b: run e2e/cluster/build.sh"
done
for c in runc openssl iptables ip findmnt curl; do
  command -v "$c" >/dev/null || die "missing '$c': run hack/install-prereqs.sh"
done
for p in bridge host-local loopback; do
  [[ -x /usr/lib/cni/$p ]] || die "missing CNI plugin /usr/lib/cni/$p: run hack/install-prereqs.sh"
done

COMPONENTS=(etcd containerd kube-apiserver kube-controller-manager kube-scheduler kubelet)
all_alive() { local c; for c in "${COMPONENTS[@]}"; do pid_alive "$c" || return 1; done; }
if [[ -d $STATE_DIR ]]; then
  if all_alive && kubectl_ get --raw /readyz >/dev/null 2>&1; then
    log "cluster already up (state in $STATE_DIR); run e2e/cluster/down.sh first for a fresh one"
    exit 0
  fi
  log "found a half-up cluster in $STATE_DIR: tearing it down first"
  "$REPO_ROOT/e2e/cluster/down.sh"
fi
# Something else holding our ports means another cluster (or a previous one whose state dir is
# gone): refuse rather than fight over it.
busy=$(ss -Hltn 2>/dev/null | awk '{print $4}' | grep -E ':(2379|2380|2381|6443|10248|10250|10257|10259)$' || true)
[[ -z $busy ]] || die "ports already in use: $(echo $busy) — is another cluster running? (e2e/cluster/down.sh cleans ours)"

NODE_IP=$(node_ip)
NODE_NAME=$(node_name)
log "up: node $NODE_NAME at $NODE_IP, state in $STATE_DIR"

mkdir -p "$STATE_DIR"/{pki,logs,pids,etcd,containerd,cni/net.d,cni/ipam,kubelet}
chmod 700 "$STATE_DIR/etcd"
chmod 700 "$STATE_DIR"

on_exit() {
  local rc=$?
  ((rc == 0)) && return
  log "up FAILED (rc=$rc)"
  local f
  for f in "$STATE_DIR"/logs/*.log; do
    [[ -f $f ]] || continue
    echo "----- last lines of ${f##*/}" >&2
    tail -n 15 "$f" >&2
  done
  if [[ ${FGPU_KEEP_ON_FAILURE:-0} == 1 ]]; then
    log "FGPU_KEEP_ON_FAILURE=1: leaving the cluster as it is; clean up with e2e/cluster/down.sh"
  else
    "$REPO_ROOT/e2e/cluster/down.sh" --keep-logs || true
  fi
}
trap on_exit EXIT

# Record what existed before, so down.sh removes only what the cluster created.
: >"$STATE_DIR/preexisting"
for p in "${HOST_PATHS[@]}"; do [[ -e $p ]] && echo "$p" >>"$STATE_DIR/preexisting"; done
for d in /etc/cdi /var/run/cdi; do
  [[ -d $d ]] && find "$d" -mindepth 1 -maxdepth 1 >>"$STATE_DIR/preexisting"
done
# The kubelet and the bridge plugin change these sysctls; down.sh puts them back.
SYSCTLS=(net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes)
for s in "${SYSCTLS[@]}"; do
  v=$(sysctl -n "$s" 2>/dev/null) && echo "$s=$v" >>"$STATE_DIR/sysctl.saved"
done
echo "$NODE_NAME" >"$STATE_DIR/node-name"

# The kubelet plugin mounts each MPS server's shm (a size-limited tmpfs) under its state dir
# through a hostPath with Bidirectional mount propagation, so that the server's pod and its
# clients see it. containerd refuses Bidirectional on a path whose mount is not shared, and
# this machine's / is private (systemd makes it shared on ordinary nodes): bind the state dir
# onto itself and make that mount shared. down.sh unmounts it.
mkdir -p "$FGPU_STATE_DIR"
findmnt -n --mountpoint "$FGPU_STATE_DIR" >/dev/null || mount --bind "$FGPU_STATE_DIR" "$FGPU_STATE_DIR"
mount --make-rshared "$FGPU_STATE_DIR"

# The pause image is built while nothing else runs yet (a cached go build: a second or two).
"$REPO_ROOT/e2e/cluster/images.sh" --no-import pause

# ---------------------------------------------------------------- certificates
PKI=$STATE_DIR/pki
(
  cd "$PKI"
  key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key" 2>/dev/null; }
  key ca
  openssl req -x509 -new -key ca.key -subj "/CN=fgpu-local-ca" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out ca.crt 2>/dev/null
  # cert NAME SUBJECT EKU [SANS]
  cert() {
    key "$1"
    openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
    {
      echo "basicConstraints=critical,CA:FALSE"
      echo "keyUsage=critical,digitalSignature,keyEncipherment"
      echo "extendedKeyUsage=$3"
      [[ -n ${4:-} ]] && echo "subjectAltName=$4"
    } >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -set_serial "0x$(openssl rand -hex 16)" \
      -days 3650 -sha256 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
  }
  cert apiserver "/CN=kube-apiserver" serverAuth \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:10.96.0.1,IP:$NODE_IP"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
  cert admin "/O=system:masters/CN=fgpu-admin" clientAuth
  cert controller-manager "/CN=system:kube-controller-manager" clientAuth
  cert scheduler "/CN=system:kube-scheduler" clientAuth
  cert kubelet-client "/O=system:nodes/CN=system:node:$NODE_NAME" clientAuth
  cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" serverAuth \
    "DNS:$NODE_NAME,DNS:localhost,IP:$NODE_IP,IP:127.0.0.1"
  key sa
  openssl ec -in sa.key -pubout -out sa.pub 2>/dev/null
  chmod 600 ./*.key
) || die "certificate generation failed"

# kubeconfig FILE CERTNAME: a kubeconfig for 127.0.0.1:6443 with the certificates embedded.
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: fgpu-local
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: fgpu-local
  context: {cluster: fgpu-local, user: $2}
current-context: fgpu-local
EOF
  chmod 600 "$1"
}
kubeconfig "$KUBECONFIG_FILE" admin
kubeconfig "$STATE_DIR/controller-manager.kubeconfig" controller-manager
kubeconfig "$STATE_DIR/scheduler.kubeconfig" scheduler
kubeconfig "$STATE_DIR/kubelet.kubeconfig" kubelet-client

GATES=()
[[ -n $FEATURE_GATES ]] && GATES=(--feature-gates="$FEATURE_GATES")

# ---------------------------------------------------------------- containerd
# Config version 4: the socket lives under the grpc server plugin (a top-level [grpc] is ignored).
# restrict_oom_score_adj and the kubelet's oomScoreAdj: 0 are required where the machine lacks
# CAP_SYS_RESOURCE, or every sandbox fails with "can't get final child's PID from pipe: EOF".
# The opt, NRI and image-verifier plugins are off: they would create /opt/containerd, /var/run/nri.
cat >"$STATE_DIR/containerd/config.toml" <<EOF
version = 4
root = "$STATE_DIR/containerd/root"
state = "/run/containerd"
imports = []
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.image-verifier.v1.bindir",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[plugins.'io.containerd.server.v1.grpc']
  address = "$CONTAINERD_SOCK"

[plugins.'io.containerd.server.v1.ttrpc']
  address = "$CONTAINERD_SOCK.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$PAUSE_IMAGE"

[plugins.'io.containerd.cri.v1.runtime']
  cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']
  restrict_oom_score_adj = true
  # network namespaces under /run/containerd rather than /run/netns: one place to clean.
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['/usr/lib/cni']
    conf_dir = "$STATE_DIR/cni/net.d"
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
EOF

# Bridge + host-local (leases in the state dir) + loopback. No masquerade, no portmap: no
# iptables rules from CNI. Pods reach the node; the service VIP is not routed (no kube-proxy).
cat >"$STATE_DIR/cni/net.d/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF

start containerd --config "$STATE_DIR/containerd/config.toml"

# ---------------------------------------------------------------- etcd
start etcd --name fgpu-local --data-dir "$STATE_DIR/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster fgpu-local=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381 \
  --unsafe-no-fsync --log-level warn
wait_for "etcd" 60 curl -fsS http://127.0.0.1:2379/health || die "etcd did not become healthy"

# ---------------------------------------------------------------- kube-apiserver
RC=()
[[ -n $RUNTIME_CONFIG ]] && RC=(--runtime-config="$RUNTIME_CONFIG")
start kube-apiserver \
  --etcd-servers=http://127.0.0.1:2379 \
  --bind-address=127.0.0.1 --secure-port=6443 --advertise-address="$NODE_IP" \
  --endpoint-reconciler-type=none \
  --service-cluster-ip-range="$SERVICE_CIDR" \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" \
  --kubelet-preferred-address-types=InternalIP \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --authorization-mode=Node,RBAC --allow-privileged=true \
  --enable-admission-plugins=NodeRestriction \
  --profiling=false --v=1 "${GATES[@]}" "${RC[@]}"

# Meanwhile: containerd up, pause image in (the kubelet needs the sandbox image before any pod).
wait_for "containerd socket" 60 ctr_ version || die "containerd did not start"
out=$(ctr_ -n k8s.io images import "$IMAGES_DIR/pause.tar" 2>&1) || die "cannot import the pause image: $out"

wait_for "kube-apiserver /readyz" 120 kubectl_ get --raw /readyz || die "kube-apiserver did not become ready"

# ---------------------------------------------------------------- controllers, scheduler, kubelet
start kube-controller-manager \
  --kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
  --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
  --cluster-name=fgpu-local --v=1 "${GATES[@]}"

start kube-scheduler \
  --kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --authorization-kubeconfig="$STATE_DIR/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --v=1 "${GATES[@]}"

KGATES=""
if [[ -n $FEATURE_GATES ]]; then
  KGATES="featureGates:"$'\n'
  IFS=, read -r -a gl <<<"$FEATURE_GATES"
  for g in "${gl[@]}"; do KGATES+="  ${g%%=*}: ${g#*=}"$'\n'; done
fi
cat >"$STATE_DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# cgroup v1 hosts: the kubelet refuses them unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
# Without CAP_SYS_RESOURCE the kubelet cannot lower its own OOM score.
oomScoreAdj: 0
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
imageServiceEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
failSwapOn: false
resolvConf: /etc/resolv.conf
serializeImagePulls: false
# A test node on a shared disk: never evict or garbage-collect images for disk pressure.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
nodeStatusUpdateFrequency: 4s
$KGATES
EOF
start kubelet --config="$STATE_DIR/kubelet/config.yaml" --kubeconfig="$STATE_DIR/kubelet.kubeconfig" \
  --node-ip="$NODE_IP" --hostname-override="$NODE_NAME" --v=2

node_ready() {
  [[ $(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null) == True ]]
}
wait_for "node $NODE_NAME Ready" 180 node_ready || die "node did not become Ready"
wait_for "default service account" 60 kubectl_ -n default get serviceaccount default ||
  die "no default service account"
for c in "${COMPONENTS[@]}"; do pid_alive "$c" || die "$c exited"; done

# Discovery can fail for a moment on a loaded machine: ask until it answers.
serves_resource_v1() { kubectl_ api-versions 2>/dev/null | grep -qx resource.k8s.io/v1; }
wait_for "resource.k8s.io/v1 served" 60 serves_resource_v1 || die "resource.k8s.io/v1 is not served"

trap - EXIT
T1=$(date +%s.%N)
log "up: cluster Ready in $(awk "BEGIN{printf \"%.1f\", $T1-$T0}")s"
cat <<EOF
export KUBECONFIG=$KUBECONFIG_FILE
kubectl:            $BIN_DIR/kubectl
containerd socket:  $CONTAINERD_SOCK   (ctr --address \$sock -n k8s.io images import X.tar)
logs:               $STATE_DIR/logs/
node:               $NODE_NAME ($NODE_IP)
EOF
