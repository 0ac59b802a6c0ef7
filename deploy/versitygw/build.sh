#!/usr/bin/env bash
# Builds versitygw (github.com/versity/versitygw/cmd/versitygw, at the version go.mod pins), the S3-compatible
# server the suite tests the S3 sources against, into a cache directory outside the repository, keyed by that
# version. Prints the binary's path on its last line. Reuses a complete earlier build.
#
#   deploy/versitygw/build.sh               # builds (or reuses) and prints the binary
#   GPUSTACK_KUBE_CACHE=/path build.sh      # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

module=github.com/versity/versitygw
version=$(awk -v m="$module" '$1==m {print $2}' go.mod | head -n1)
[ -n "$version" ] || { echo "build.sh: no $module version in go.mod" >&2; exit 1; }

root=${GPUSTACK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/kube}
out="$root/versitygw-$version"
stamp="$out/.complete"
want="$version $(sha256sum go.sum build.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$out/versitygw"
  exit 0
fi

mkdir -p "$out"
export CGO_ENABLED=0  # leaves out the cgo-only parts (RDMA, cuObject)
start=$(date +%s)
echo "building versitygw $version into $out (a cold build takes a few minutes)" >&2
# As versitygw's own Makefile: the version it reports (versitygw --version) is the release's.
go build -trimpath -ldflags "-s -w -X main.Version=$version" -o "$out/versitygw.tmp" "$module/cmd/versitygw"
mv "$out/versitygw.tmp" "$out/versitygw"
echo "$want" > "$stamp"
echo "versitygw $version built in $(( $(date +%s) - start ))s" >&2
echo "$out/versitygw"
