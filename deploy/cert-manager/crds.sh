#!/usr/bin/env bash
# Prints the directory of cert-manager's CRDs at the version go.mod pins (downloaded once into the Go
# module cache, checked against go.sum).
set -euo pipefail
cd "$(dirname "$0")"
module=github.com/cert-manager/cert-manager
dir=$(go mod download -json "$module" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir/deploy/crds" ] || { echo "crds.sh: no deploy/crds in $module" >&2; exit 1; }
echo "$dir/deploy/crds"
