#!/usr/bin/env bash
# Builds etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl and kubelet from the
# Kubernetes Go modules pinned in go.mod into a cache directory outside the repository, keyed by the
# Kubernetes version. Prints that directory on its last line. Reuses a complete earlier build.
#
#   deploy/controlplane/build.sh            # builds (or reuses) and prints the bin directory
#   GPUSTACK_KUBE_CACHE=/path build.sh      # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/kube)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

version=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3} $1=="k8s.io/kubernetes" && $2 ~ /^v1\./ {print $2}' go.mod | head -n1)
[ -n "$version" ] || { echo "build.sh: no k8s.io/kubernetes version in go.mod" >&2; exit 1; }
# The staging modules must follow the one pinned version: k8s.io/kubernetes v1.X.Y => k8s.io/* v0.X.Y.
staging="v0.${version#v1.}"
if grep -E '^\s+k8s\.io/[a-z-]+ => k8s\.io/[a-z-]+ v' go.mod | grep -v " $staging\$" >&2; then
  echo "build.sh: the replace lines above do not follow k8s.io/kubernetes $version (want $staging)" >&2
  exit 1
fi
major=$(echo "$version" | sed -E 's/^v([0-9]+)\..*/\1/')
minor=$(echo "$version" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')

root=${GPUSTACK_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/kube}
out="$root/$version"
stamp="$out/.complete"
targets=(
  ./cmd/etcd
  k8s.io/kubernetes/cmd/kube-apiserver
  k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler
  k8s.io/kubernetes/cmd/kubectl
  k8s.io/kubernetes/cmd/kubelet
)
# The stamp records the module sum and the binaries built, so a changed go.sum or a cache made before a
# binary was added rebuilds rather than reusing stale or missing binaries.
want="$version $(sha256sum go.sum | cut -c1-16) $(for t in "${targets[@]}"; do basename "$t"; done | tr '\n' ' ' | sed 's/ $//')"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$out"
ldflags=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
  ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
ldflags+=" -s -w"

export CGO_ENABLED=0
# Memory on small machines: one package at a time keeps the link of kube-apiserver under ~2 GiB.
export GOFLAGS="${GOFLAGS:--p=$(nproc)}"
start=$(date +%s)
echo "building Kubernetes $version control plane and kubelet into $out (a cold build takes 10-20 minutes)" >&2
for target in "${targets[@]}"; do
  name=$(basename "$target")
  t0=$(date +%s)
  go build -trimpath -ldflags "$ldflags" -o "$out/$name.tmp" "$target"
  mv "$out/$name.tmp" "$out/$name"
  echo "  built $name ($(du -h "$out/$name" | cut -f1), $(( $(date +%s) - t0 ))s)" >&2
done
echo "$want" > "$stamp"
echo "control plane $version built in $(( $(date +%s) - start ))s" >&2
echo "$out"
