#!/usr/bin/env bash
# make demo-down: remove the demo's cluster and everything it left on the machine.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$root"/e2e/cluster/down.sh
rm -rf /var/run/fgpu
