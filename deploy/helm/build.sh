#!/usr/bin/env bash
# Builds helm (helm.sh/helm/v3/cmd/helm, at the version go.mod pins) into a cache directory outside the
# repository, keyed by that version. Prints the binary's path on its last line. Reuses a complete earlier build.
#
#   deploy/helm/build.sh                    # builds (or reuses) and prints the binary
#   GPUSTACK_KUBE_CACHE=/path build.sh      # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

module=helm.sh/helm/v3
version=$(awk -v m="$module" '$1==m {print $2}' go.mod | head -n1)
[ -n "$version" ] || { echo "build.sh: no $module version in go.mod" >&2; exit 1; }

root=${GPUSTACK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/kube}
out="$root/helm-$version"
stamp="$out/.complete"
want="$version $(sha256sum go.sum build.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$out/helm"
  exit 0
fi

mkdir -p "$out"
export CGO_ENABLED=0
start=$(date +%s)
echo "building helm $version into $out (a cold build takes a few minutes)" >&2
# As helm's own Makefile: the Kubernetes version it assumes without a cluster follows its client-go (v0.X => 1.X).
client=$(awk '$1=="k8s.io/client-go" {print $2}' go.mod | head -n1)
kminor=$(echo "$client" | sed -E 's/^v0\.([0-9]+)\..*/\1/')
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$kminor"
done
go build -trimpath -ldflags "$ldflags" -o "$out/helm.tmp" "$module/cmd/helm"
mv "$out/helm.tmp" "$out/helm"
echo "$want" > "$stamp"
echo "helm $version built in $(( $(date +%s) - start ))s" >&2
echo "$out/helm"
