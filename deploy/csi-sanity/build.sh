#!/usr/bin/env bash
# Builds csi-sanity (github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity, at the version go.mod pins)
# into a cache directory outside the repository, keyed by that version. Prints the binary's path on its
# last line. Reuses a complete earlier build.
#
#   deploy/csi-sanity/build.sh              # builds (or reuses) and prints the binary
#   GPUSTACK_KUBE_CACHE=/path build.sh      # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

module=github.com/kubernetes-csi/csi-test/v5
version=$(awk -v m="$module" '$1==m {print $2}' go.mod | head -n1)
[ -n "$version" ] || { echo "build.sh: no $module version in go.mod" >&2; exit 1; }

root=${GPUSTACK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/kube}
out="$root/csi-sanity-$version"
stamp="$out/.complete"
want="$version $(sha256sum go.sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$out/csi-sanity"
  exit 0
fi

mkdir -p "$out"
export CGO_ENABLED=0
start=$(date +%s)
echo "building csi-sanity $version into $out" >&2
go build -trimpath -ldflags "-s -w" -o "$out/csi-sanity.tmp" "$module/cmd/csi-sanity"
mv "$out/csi-sanity.tmp" "$out/csi-sanity"
echo "$want" > "$stamp"
echo "csi-sanity $version built in $(( $(date +%s) - start ))s" >&2
echo "$out/csi-sanity"
