#!/usr/bin/env bash
# Generates the typed clientset, listers and informers of fgpu's API into pkg/client, with the
# flags k8s.io/code-generator's kube_codegen.sh passes (gen_client --with-watch). The
# generators run at the version of the repo's k8s.io modules (code-generator is released in
# step with them), through `go run`: nothing to install, only the Go module proxy.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

GO=${GO:-go}
module=$($GO list -m)
version=${CODE_GENERATOR_VERSION:-$($GO list -m -f '{{.Version}}' k8s.io/apimachinery)}
api_base="$root/api"
api_pkg="$module/api/fgpu.dev/v1alpha1"
out_pkg="$module/pkg/client"

gen() { $GO run "k8s.io/code-generator/cmd/$1@$version" --go-header-file /dev/null "${@:2}"; }

# Everything under these directories is generated: start clean so that removed types leave no
# stale files behind.
rm -rf pkg/client/clientset pkg/client/listers pkg/client/informers

gen client-gen --output-dir pkg/client/clientset --output-pkg "$out_pkg/clientset" \
  --clientset-name versioned --input-base "$api_base" --input fgpu.dev/v1alpha1
gen lister-gen --output-dir pkg/client/listers --output-pkg "$out_pkg/listers" "$api_pkg"
gen informer-gen --output-dir pkg/client/informers --output-pkg "$out_pkg/informers" \
  --versioned-clientset-package "$out_pkg/clientset/versioned" \
  --listers-package "$out_pkg/listers" "$api_pkg"
