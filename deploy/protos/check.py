"""Checks that the protos and licences committed in deploy/protos are byte for byte those of the module versions
deploy/controlplane/go.mod pins (SOURCES lists each file, its module, version, path and sha256); exits non-zero
naming every stale file and what to run. ``--update`` copies the pinned modules' files here and rewrites SOURCES.

    python deploy/protos/check.py [--update]

It asks ``go mod download`` for each module (the module cache, else the Go proxy).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
GO_MODULE = HERE.parent / "controlplane"
SOURCES = HERE / "SOURCES"


def rows() -> list[list[str]]:
    """SOURCES' rows: file, module, version, path in the module, sha256."""
    lines = SOURCES.read_text().splitlines()
    return [line.split() for line in lines if line.strip() and not line.startswith("#")]


def pinned(module: str) -> tuple[str, Path]:
    """The version of ``module`` go.mod selects and its directory in the module cache."""
    done = subprocess.run(["go", "mod", "download", "-json", module], cwd=GO_MODULE, capture_output=True, text=True)
    info = json.loads(done.stdout or "{}")
    if done.returncode or info.get("Error"):
        sys.exit(f"deploy/protos: go mod download {module} failed: {info.get('Error') or done.stderr.strip()}")
    return info["Version"], Path(info["Dir"])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def problems(row: list[str]) -> list[str]:
    """What is stale about one committed file, in words."""
    name, module, version, inner, recorded = row
    want_version, directory = pinned(module)
    committed, upstream = HERE / name, directory / inner
    found = []
    if want_version != version:
        found.append(f"go.mod pins {module} {want_version}, SOURCES records {version}")
    if not committed.exists() or committed.read_bytes() != upstream.read_bytes():
        found.append(f"differs from {inner} of {module} {want_version}")
    elif sha256(committed) != recorded:
        found.append(f"its sha256 is {sha256(committed)}, SOURCES records {recorded}")
    return [f"deploy/protos/{name}: {problem}" for problem in found]


def update() -> None:
    """Copies each file from the pinned module and writes the new versions and sums into SOURCES."""
    text = SOURCES.read_text()
    for name, module, version, inner, recorded in rows():
        want_version, directory = pinned(module)
        shutil.copyfile(directory / inner, HERE / name)
        old = next(line for line in text.splitlines() if line.split()[:1] == [name])
        new = old.replace(f" {version} ", f" {want_version} ", 1).replace(recorded, sha256(HERE / name))
        text = text.replace(old, new)
    SOURCES.write_text(text)


def main(argv: list[str]) -> int:
    if argv == ["--update"]:
        update()
    elif argv:
        sys.exit(__doc__)
    stale = [problem for row in rows() for problem in problems(row)]
    if stale:
        print("\n".join(stale), file=sys.stderr)
        print(
            "The committed protos are not those of deploy/controlplane/go.mod's modules: run "
            "`python deploy/protos/check.py --update`, review the diff, then `make protos` and the tests.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
