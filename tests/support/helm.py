"""helm, built from its Go module by ``deploy/helm/build.sh`` (cached like the control plane), and a runner
for it with a home of the test run's own."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.paths import REPO, TEST_STATE

CHART = REPO / "deploy" / "chart" / "gpustack-models"


@pytest.fixture(scope="session")
def helm() -> str:
    """The helm binary's path."""
    out = subprocess.run([str(REPO / "deploy" / "helm" / "build.sh")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def run_helm(helm: str, *args: str, kubeconfig=None, check: bool = True) -> subprocess.CompletedProcess:
    env = {
        "HOME": str(TEST_STATE / "helm-home"),
        "PATH": "/usr/bin:/bin",
        "HELM_CACHE_HOME": str(TEST_STATE / "helm-cache"),
    }
    cmd = [helm, *args]
    if kubeconfig is not None:
        cmd += ["--kubeconfig", str(kubeconfig)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
