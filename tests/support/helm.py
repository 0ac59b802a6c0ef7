"""helm, built from its Go module by ``deploy/helm/build.sh`` (cached like the control plane), and a runner
for it with a home of the test run's own."""

from __future__ import annotations

import subprocess

import pytest
import yaml

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


def helm_test_account(namespace: str, release: str) -> str:
    """The ``helm test`` Pod's ServiceAccount as the release will own it: a server dry run of a whole render
    needs it to exist already (a Pod's ServiceAccount is checked at admission; a dry run creates none), and a
    later ``helm install`` of ``release`` adopts it."""
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": "gpustack-models-test",
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
                "annotations": {"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace},
            },
        }
    )
