"""oras, the OCI registry client, built from its Go module by ``deploy/oras/build.sh`` (cached like the
control plane): the suite pushes model artifacts with it as teams do, and the benchmark pulls with it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.paths import REPO

ORAS_BUILD = REPO / "deploy" / "oras" / "build.sh"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
MODEL_WEIGHT = "application/vnd.cncf.model.weight.v1.raw"


def oras_binary() -> str:
    """The oras binary's path: ``deploy/oras/build.sh`` builds it on first use (tens of seconds cold), reuses
    it after."""
    out = subprocess.run([str(ORAS_BUILD)], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{ORAS_BUILD.relative_to(REPO)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def oras(args: list[str], user: tuple[str, str], work: Path, timeout: float = 300) -> str:
    """Run oras against a plain-HTTP registry as ``user`` (its password on stdin), with a credential store and
    environment of its own (nothing of the machine's proxies or logins); its output."""
    work.mkdir(parents=True, exist_ok=True)
    cmd = [oras_binary(), *args, "--plain-http", "-u", user[0], "--password-stdin"]
    cmd += ["--registry-config", str(work / "oras-auth.json")]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and not k.startswith("ORAS_")}
    env["DOCKER_CONFIG"] = str(work / "docker")
    proc = subprocess.run(cmd, input=user[1], env=env, cwd=work, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"oras {args[0]} failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
    return proc.stdout + proc.stderr


def push_model(reference: str, files: dict[str, bytes], user: tuple[str, str], work: Path) -> str:
    """``oras push`` of a model's files as a CNCF ModelPack artifact (a layer per file, titled by its path);
    returns the manifest digest oras reports."""
    for path, data in files.items():
        (work / path).parent.mkdir(parents=True, exist_ok=True)
        (work / path).write_bytes(data)
    (work / ".config.json").write_text('{"descriptor": {"name": "test-model"}}')
    layers = [f"{path}:{MODEL_WEIGHT}" for path in sorted(files)]
    args = ["push", "--artifact-type", MODEL_ARTIFACT, "--config", f".config.json:{MODEL_CONFIG}", reference, *layers]
    out = oras(args, user, work)
    found = re.search(r"Digest: (sha256:[0-9a-f]{64})", out)
    if found is None:
        raise RuntimeError(f"oras push named no digest: {out[-2000:]}")
    return found.group(1)
