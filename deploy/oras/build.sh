#!/usr/bin/env bash
# Builds oras (oras.land/oras/cmd/oras, at the version go.mod pins), the OCI registry client `make bench`
# compares the plugin's registry downloads with (`oras pull`), into a cache directory outside the repository,
# keyed by that version. Prints the binary's path on its last line. Reuses a complete earlier build.
#
#   deploy/oras/build.sh                    # builds (or reuses) and prints the binary
#   GPUSTACK_KUBE_CACHE=/path build.sh      # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

module=oras.land/oras
version=$(awk -v m="$module" '$1==m {print $2}' go.mod | head -n1)
[ -n "$version" ] || { echo "build.sh: no $module version in go.mod" >&2; exit 1; }

root=${GPUSTACK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/kube}
out="$root/oras-$version"
stamp="$out/.complete"
want="$version $(sha256sum go.sum build.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$out/oras"
  exit 0
fi

mkdir -p "$out"
export CGO_ENABLED=0  # as oras's own release builds
start=$(date +%s)
echo "building oras $version into $out (a cold build takes under a minute)" >&2
# As oras's own Makefile for a release: the version it reports (oras version) is the module's, no build metadata.
go build -trimpath -ldflags "-s -w" -o "$out/oras.tmp" "$module/cmd/oras"
mv "$out/oras.tmp" "$out/oras"
echo "$want" > "$stamp"
echo "oras $version built in $(( $(date +%s) - start ))s" >&2
echo "$out/oras"
