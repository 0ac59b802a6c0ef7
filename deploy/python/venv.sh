#!/usr/bin/env bash
# Makes .venv, the virtualenv every make target runs in, with requirements-dev.txt installed (the runtime
# requirements, the suite's and the protos' compiler). A fresh clone links .venv to one built once per set of
# pinned requirements and Python version in a cache outside the repository (as the Go-built tools are), so
# `make test` on a new checkout does not install everything again; an existing .venv directory is kept and
# installed into as before.
#
#   deploy/python/venv.sh [PYTHON]        # PYTHON: the interpreter to build with (default python3)
#   GPUSTACK_VENV_CACHE=/path             # cache root (default: ${XDG_CACHE_HOME:-~/.cache}/gpustack-models/venv)
set -euo pipefail
cd "$(dirname "$0")/../.."
python=${1:-python3}
requirements=(requirements.txt requirements-dev.txt deploy/protos/requirements.txt)

install() {  # into the virtualenv $1, made if missing
  [ -x "$1/bin/python" ] || "$python" -m venv "$1"
  "$1/bin/python" -m pip install --disable-pip-version-check -q -r requirements-dev.txt
}

if [ -d .venv ] && [ ! -L .venv ]; then
  install .venv
  exit 0
fi

key=$({ "$python" -c 'import sys; print(sys.version)'; cat "${requirements[@]}"; } | sha256sum | cut -c1-16)
root=${GPUSTACK_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpustack-models/venv}
out="$root/$key"
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9  # two checkouts building the same set wait for one another
if [ ! -f "$out/.complete" ]; then
  echo "venv.sh: installing requirements-dev.txt into $out (once for these pins)" >&2
  rm -rf "$out"
  install "$out"
  touch "$out/.complete"
fi
ln -sfn "$out" .venv
