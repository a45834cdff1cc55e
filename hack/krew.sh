#!/usr/bin/env bash
# Builds the kubectl-fgpu archives for each platform of plugins/fgpu.yaml into _output/krew
# and writes the krew manifest there with VERSION and the archives' sha256 filled in.
# Usage: hack/krew.sh v0.1.0
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
version=${1:?usage: hack/krew.sh VERSION}
out=_output/krew
rm -rf "$out" && mkdir -p "$out"
# The template's own comment is not the release's.
manifest=$(sed -e "/^#/d" -e "s/@VERSION@/$version/g" plugins/fgpu.yaml)
for platform in linux/amd64 linux/arm64 darwin/amd64 darwin/arm64; do
  os=${platform%/*} arch=${platform#*/}
  dir=$(mktemp -d)
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch ${GO:-go} build -trimpath -o "$dir/kubectl-fgpu" ./cmd/kubectl-fgpu
  cp LICENSE "$dir/"
  archive="$out/kubectl-fgpu_${version}_${os}_${arch}.tar.gz"
  tar -C "$dir" -czf "$archive" kubectl-fgpu LICENSE
  rm -rf "$dir"
  sum=$(sha256sum "$archive" | cut -d' ' -f1)
  manifest=${manifest//@SHA256_${os}_${arch}@/$sum}
done
printf '%s\n' "$manifest" > "$out/fgpu.yaml"
if grep -q '@[A-Z0-9_a-z]*@' "$out/fgpu.yaml"; then
  echo "krew.sh: placeholders left in $out/fgpu.yaml" >&2
  exit 1
fi
echo "wrote $out/fgpu.yaml and its archives"
