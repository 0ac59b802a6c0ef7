#!/usr/bin/env bash
# Prints the directory of prometheus-operator's CRDs at the version go.mod pins (downloaded once into the Go
# module cache, checked against go.sum).
set -euo pipefail
cd "$(dirname "$0")"
module=github.com/prometheus-operator/prometheus-operator
dir=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
crds="$dir/example/prometheus-operator-crd"
[ -d "$crds" ] || { echo "crds.sh: no example/prometheus-operator-crd in $module" >&2; exit 1; }
echo "$crds"
