"""Fixtures: the real control plane (started once per session) and clients for it."""

from __future__ import annotations

import os
import uuid

import pytest
import requests
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from gpustack_models.local.cluster import LocalCluster, Ports
from tests.support.kubernetes import kubectl_run
from tests.support.paths import REPO, TEST_STATE


@pytest.fixture(scope="session")
def cluster():
    """A real etcd + kube-apiserver + kube-controller-manager + kube-scheduler for the whole session, with
    the CRDs."""
    state = TEST_STATE / "cluster"
    if (state / "cluster.json").exists():
        LocalCluster.from_state(state).stop()
    LocalCluster(state).wipe()
    lc = LocalCluster(
        state,
        ports=Ports.free(),
        compaction_interval=os.environ.get("GPUSTACK_TEST_COMPACTION_INTERVAL", "5m"),
    )
    try:
        lc.start()
        kubectl_run(lc, "apply", "--server-side", "-f", str(REPO / "deploy" / "crds"))
        kubectl_run(lc, "wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
        yield lc
    finally:
        lc.stop()


@pytest.fixture
def kubectl(cluster, tmp_path):
    """kubectl with a fresh discovery cache per test (kubectl caches discovery for hours)."""

    def run(*args, **kwargs):
        kwargs.setdefault("cache_dir", str(tmp_path / "kube-cache"))
        return kubectl_run(cluster, *args, **kwargs)

    return run


@pytest.fixture(scope="session")
def api_client(cluster):
    return k8s_config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.fixture(scope="session")
def core(api_client):
    return k8s.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def custom(api_client):
    return k8s.CustomObjectsApi(api_client)


@pytest.fixture(scope="session")
def admin_http(cluster):
    """A requests session authenticated as the cluster admin (client certificate)."""
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.cert = (str(cluster.pki_path("admin.crt")), str(cluster.pki_path("admin.key")))
    session.base = cluster.server
    return session


def fresh_namespace(core):
    """A generator for fixtures: a fresh namespace, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    try:
        core.delete_namespace(name)
    except k8s.ApiException:
        pass


@pytest.fixture
def namespace(core):
    """A fresh namespace, deleted after the test."""
    yield from fresh_namespace(core)
