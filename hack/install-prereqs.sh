#!/usr/bin/env bash
# Installs the Debian packages the local test cluster (e2e/cluster) needs on the host: runc and the
# CNI plugins that containerd drives, iptables/conntrack for the kubelet, openssl for the
# certificates, and the small tools the scripts call. Idempotent: when everything is installed it
# only checks and returns. Run as root on Debian 12 (or another apt-based system).
#
# Go itself is not installed here: the build needs the Go toolchain named in go.mod.
set -euo pipefail

PKGS=(
  runc                        # OCI runtime containerd's runc shim calls (/usr/sbin/runc)
  containernetworking-plugins # bridge, host-local, loopback in /usr/lib/cni
  iptables                    # kubelet canary chains
  conntrack                   # kubelet/CNI flush conntrack entries
  openssl                     # cluster certificates
  iproute2                    # ip, ss
  procps                      # ps, pkill-free process inspection, sysctl
  util-linux                  # findmnt, mount/umount, nsenter
  kmod                        # modprobe (overlay, br_netfilter)
  ca-certificates
  curl                        # readiness probes of the API server
  gcc                         # cgo: the kubelet plugin's NVML backend (go-nvml) in its image
  libc6-dev
)

if [[ $(id -u) -ne 0 ]]; then
  echo "install-prereqs: must run as root (apt-get install)" >&2
  exit 1
fi
if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
  echo "install-prereqs: needs an apt-based system (Debian 12 is what is tested)" >&2
  exit 1
fi

missing=()
for p in "${PKGS[@]}"; do
  if [[ $(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true) != installed ]]; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  echo "install-prereqs: all present (${PKGS[*]})"
else
  echo "install-prereqs: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Kernel pieces: overlayfs for containerd's snapshotter, br_netfilter is optional (no kube-proxy).
if ! grep -qw overlay /proc/filesystems; then
  modprobe overlay 2>/dev/null || echo "install-prereqs: warning: overlayfs not available; containerd will fail to unpack images" >&2
fi

if ! command -v go >/dev/null; then
  echo "install-prereqs: note: no 'go' on PATH; e2e/cluster/build.sh needs the Go toolchain from go.mod" >&2
fi
