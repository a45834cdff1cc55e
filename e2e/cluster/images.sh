#!/usr/bin/env bash
# Builds the project's container images from static binaries (no registry, no Docker) and imports
# them into the local cluster's containerd (namespace k8s.io), so pods can run them with
# imagePullPolicy: Never (or IfNotPresent).
#
#   images.sh [--no-import] [TARGET...]
#
# TARGETs (default: pause fgpu):
#   pause        fgpu.dev/pause:dev, the sandbox image containerd pins (from e2e/cmd/pause)
#   fgpu         $FGPU_IMAGE (fgpu.dev/fgpu:dev): every main package under $FGPU_IMAGE_PKGS
#                (./cmd/...), each at /usr/bin/<name>; no entrypoint unless there is one binary,
#                so pods name the binary in `command:`
#   TAG=PKG[,PKG...]  any other image from main packages of this module, e.g.
#                fgpu.dev/sleeper:dev=./e2e/cmd/pause; entrypoint = the first binary
#
# Tarballs are left in _output/images/<name>.tar (docker-archive; `kind load image-archive` takes
# them too). --no-import only builds them. Env: CGO_ENABLED (default 0) and GOFLAGS apply to the
# builds; FGPU_BUILD_TAGS adds build tags; FGPU_CGO_PKGS (default ./cmd/fgpu-kubelet-plugin, whose
# NVML backend needs cgo) are built with cgo. A binary that comes out dynamically linked gets its
# shared libraries copied into the image, and the C library's others that the NVIDIA driver's
# libraries (loaded at run time from the host's driver root) need.
# The builds use the flags of the suite's other builds (no -trimpath, Go's default C flags): the
# static ones those of make gpucheck-fake, the cgo one those of the unit tests, so that a cold
# machine compiles the dependencies once, not again here (about 15 minutes on 2 cores).
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMPORT=1
TARGETS=()
for a in "$@"; do
  case $a in
    --no-import) IMPORT=0 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    -*) die "unknown flag $a" ;;
    *) TARGETS+=("$a") ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=(pause fgpu)

FGPU_IMAGE=${FGPU_IMAGE:-fgpu.dev/fgpu:dev}
FGPU_IMAGE_PKGS=${FGPU_IMAGE_PKGS:-./cmd/...}
export CGO_ENABLED=${CGO_ENABLED:-0}
FGPU_CGO_PKGS=${FGPU_CGO_PKGS:-./cmd/fgpu-kubelet-plugin}
TAGS_ARG=()
[[ -n ${FGPU_BUILD_TAGS:-} ]] && TAGS_ARG=(-tags "$FGPU_BUILD_TAGS")

command -v go >/dev/null || die "no 'go' on PATH"
cd "$REPO_ROOT"
mkdir -p "$IMAGES_DIR/bin" "$BIN_DIR"
log "images: building mkimage"
go build -o "$BIN_DIR/mkimage" ./e2e/cmd/mkimage || die "cannot build e2e/cmd/mkimage"

# main_pkgs PATTERN...: import paths of the main packages matching the patterns.
main_pkgs() {
  go list -e -f '{{if eq .Name "main"}}{{.ImportPath}}{{end}}' "$@" 2>/dev/null | sed '/^$/d'
}

# DLOPEN_LIBS: what libnvidia-ml and libcuda link against besides libc; a dynamic binary that
# dlopens them from the driver root needs them in its image.
DLOPEN_LIBS=(libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1)

# lib_files BINARY: --file arguments for the shared libraries (and loader) of a dynamic binary.
lib_files() {
  local bin=$1 lib libc
  ldd "$bin" >/dev/null 2>&1 || return 0 # static: "not a dynamic executable"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*' | sort -u); do
    [[ -f $lib ]] && printf -- '--file\n%s:%s\n' "$(readlink -f "$lib")" "$lib"
  done
  libc=$(ldd "$bin" | grep -o '/[^ ]*/libc\.so\.6' | head -1)
  [[ -n $libc ]] || return 0
  for lib in "${DLOPEN_LIBS[@]}"; do
    lib=$(dirname "$libc")/$lib
    [[ -f $lib ]] && printf -- '--file\n%s:%s\n' "$(readlink -f "$lib")" "$lib"
  done
}

# image TAG ENTRYPOINT(yes|no) PKG...: builds the packages and packs them as one image.
image() {
  local tag=$1 ep=$2; shift 2
  local short=${tag##*/}; short=${short%%:*}
  local bindir=$IMAGES_DIR/bin/$short out=$IMAGES_DIR/$short.tar
  local pkgs
  mapfile -t pkgs < <(main_pkgs "$@")
  if ((${#pkgs[@]} == 0)); then
    log "images: $tag: no main packages in $* — skipped"
    return 0
  fi
  rm -rf "$bindir" && mkdir -p "$bindir"
  local cgo=() p
  mapfile -t cgo < <(main_pkgs $FGPU_CGO_PKGS)
  local plain=()
  for p in "${pkgs[@]}"; do
    [[ " ${cgo[*]} " == *" $p "* ]] || plain+=("$p")
  done
  log "images: $tag: go build ${pkgs[*]}"
  if ((${#plain[@]})); then
    go build "${TAGS_ARG[@]}" -ldflags "-s -w" -o "$bindir/" "${plain[@]}" || die "build for $tag failed"
  fi
  for p in "${pkgs[@]}"; do
    [[ " ${cgo[*]} " == *" $p "* ]] || continue
    command -v gcc >/dev/null || die "$p needs cgo (NVML) and there is no gcc: hack/install-prereqs.sh installs it"
    CGO_ENABLED=1 go build "${TAGS_ARG[@]}" -ldflags "-s -w" -o "$bindir/" "$p" ||
      die "cgo build of $p for $tag failed"
  done
  local args=(--tag "$tag" --out "$out") b first=""
  for p in "${pkgs[@]}"; do
    b=${p##*/}
    [[ -z $first ]] && first=$b
    args+=(--file "$bindir/$b:/usr/bin/$b")
    mapfile -t -O "${#args[@]}" args < <(lib_files "$bindir/$b")
  done
  if [[ $ep == yes || ${#pkgs[@]} -eq 1 ]]; then
    args+=(--entrypoint "/usr/bin/$first")
  fi
  "$BIN_DIR/mkimage" "${args[@]}" >/dev/null || die "mkimage for $tag failed"
  BUILT+=("$out")
  log "images: $tag -> ${out#"$REPO_ROOT"/}"
}

BUILT=()
for t in "${TARGETS[@]}"; do
  case $t in
    pause)
      mkdir -p "$IMAGES_DIR/bin/pause"
      CGO_ENABLED=0 go build -ldflags "-s -w" -o "$IMAGES_DIR/bin/pause/pause" ./e2e/cmd/pause ||
        die "cannot build e2e/cmd/pause"
      "$BIN_DIR/mkimage" --tag "$PAUSE_IMAGE" --out "$IMAGES_DIR/pause.tar" \
        --file "$IMAGES_DIR/bin/pause/pause:/pause" --entrypoint /pause >/dev/null || die "mkimage for pause failed"
      BUILT+=("$IMAGES_DIR/pause.tar")
      log "images: $PAUSE_IMAGE -> _output/images/pause.tar"
      ;;
    fgpu)
      # shellcheck disable=SC2086 # the package list is space-separated patterns
      image "$FGPU_IMAGE" no $FGPU_IMAGE_PKGS
      ;;
    *=*)
      IFS=, read -r -a pk <<<"${t#*=}"
      image "${t%%=*}" yes "${pk[@]}"
      ;;
    *) die "unknown target $t (want pause, fgpu or TAG=PKG[,PKG...])" ;;
  esac
done

if ((IMPORT)); then
  [[ -S $CONTAINERD_SOCK ]] || die "no containerd socket at $CONTAINERD_SOCK: start the cluster (e2e/cluster/up.sh) or pass --no-import"
  for f in "${BUILT[@]}"; do
    out=$(ctr_ -n k8s.io images import "$f" 2>&1) || die "import of $f failed: $out"
    log "images: imported ${f#"$REPO_ROOT"/}"
  done
fi
