"""The whole chart installed by helm as Pods on the real node: ``chart_release`` (module scope).

The release (``RELEASE`` in ``NAMESPACE``) runs the image built here: two API replicas, the informers, the
Celery worker, beat (one each), the migrate Job, the hooks and the plugin DaemonSet, all on the real node;
the console is off. It talks to the suite's PostgreSQL (a database of its own), Redis (a lane database of
its own), fake hub and kube-apiserver through the relays of ``tests/support/relay.py``: kube-apiserver
reaches the API's Service by its ClusterIP, the Pods reach kube-apiserver by the ``kubernetes`` Service's,
and the loopback services by the bridge's host address. The plugin runs in the node's network and reaches the
API through a loopback relay of its own (``plugin.hostAliases``, as in ``tests/test_chart_node.py``).

The suite's control plane holds the local worker's cluster-wide objects (RBAC, APIService, webhook, admission
policies, CSIDriver) under the chart's names. For the module the suite's worker stack is stopped, its
APIService and webhook are removed and the cluster-wide objects it shares with the chart are handed to the
release (Helm takes over objects carrying its ownership metadata); afterwards the launcher applies them again
and registers the suite's API.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import yaml

from gpustack_models import kube
from gpustack_models.local.statedir import SERVICE_IP
from tests.support import TEST_STATE, wait_for
from tests.support.helm import CHART, run_helm
from tests.support.image_build import IMAGE, import_image
from tests.support.kubelet import BRIDGE_ADDRESS
from tests.support.relay import bridge_relay, loopback_address, ready_endpoints, relaying, service_relay
from tests.support.worker import own_broker, without_session_stack

RELEASE = "rel"
NAMESPACE = "gpustack-release"
API_SERVICE = "gpustack-models-api"
REDIS_INDEX = 3  # a lane's Redis database that tests empty and use alone
OWNER = {"meta.helm.sh/release-name": RELEASE, "meta.helm.sh/release-namespace": NAMESPACE}


def here(real_node) -> dict:
    """Placement on the real node (and nowhere else)."""
    return {"nodeSelector": {"kubernetes.io/hostname": real_node.name}, "tolerations": [real_node.toleration]}


def plugin_values(real_node, cluster, hub, api_port: int) -> dict:
    from gpustack_models.local.cluster import free_port

    host = f"{API_SERVICE}.{NAMESPACE}.svc"
    return {
        # The node, not the default's GPU feature discovery label (null drops a default key).
        "nodeSelector": {"kubernetes.io/hostname": real_node.name, "nvidia.com/gpu.present": None},
        "tolerations": [real_node.toleration],
        "kubeletDir": str(real_node.root_dir),
        "cacheDir": str(real_node.dir / "release-plugin"),
        "port": free_port(),
        "peerPort": free_port(),
        "hostNetwork": True,
        "hostAliases": [{"ip": "127.0.0.1", "hostnames": [host]}],
        "env": {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(cluster.ports.apiserver),
            "GPUSTACK_API_URL": f"https://{host}:{api_port}",
            "HF_ENDPOINT": hub.url,
            "MODELSCOPE_ENDPOINT": hub.url,
        },
        "uninstall": {"graceSeconds": 60},
    }


def release_values(real_node, cluster, hub, relays: dict) -> dict:
    repository, tag = IMAGE.rsplit(":", 1)
    hub_url = f"http://{BRIDGE_ADDRESS}:{relays['hub'].port}"
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "api": {"replicas": 2, "workers": 1, "threads": 8, **here(real_node)},
        "informers": {"replicas": 1, **here(real_node)},
        "worker": {"replicas": 1, "concurrency": 2, **here(real_node)},
        "beat": {"replicas": 1, **here(real_node)},
        "console": {"enabled": False},
        "migrate": here(real_node),
        "hooks": {**here(real_node), "uninstall": {"enabled": True, "timeoutSeconds": 120}},
        "env": {"HF_ENDPOINT": hub_url, "MODELSCOPE_ENDPOINT": hub_url, "GPUSTACK_RESOLVE_RETRY_BASE": "0.5"},
        "plugin": plugin_values(real_node, cluster, hub, relays["plugin-api"].port),
    }


@contextlib.contextmanager
def own_database(django_db_blocker) -> Iterator[dict]:
    """A database of the release's own on the suite's PostgreSQL (its connection settings), dropped after."""
    import psycopg
    from django.db import connection

    with django_db_blocker.unblock():
        settings = dict(connection.settings_dict)
    settings["NAME"] = f"{settings['NAME']}_release"
    server = {"host": settings["HOST"], "port": settings["PORT"], "user": settings["USER"], "dbname": "postgres"}
    with psycopg.connect(**server, password=settings.get("PASSWORD") or None, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{settings["NAME"]}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{settings["NAME"]}"')
    try:
        yield settings
    finally:
        with psycopg.connect(**server, password=settings.get("PASSWORD") or None, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{settings["NAME"]}" WITH (FORCE)')


@contextlib.contextmanager
def host_relays(admin: kube.Kube, cluster, database: dict, redis_url: str, hub) -> Iterator[dict]:
    """The relays every Pod of the release needs, by name (the API Service's comes with each install)."""
    redis = urlsplit(redis_url)
    with contextlib.ExitStack() as stack:
        stack.enter_context(loopback_address(SERVICE_IP))
        relays = {
            "kubernetes": relaying((SERVICE_IP, 443), lambda: [("127.0.0.1", cluster.ports.apiserver)]),
            "postgres": bridge_relay(int(database["PORT"]), database["HOST"]),
            "redis": bridge_relay(redis.port, redis.hostname),
            "hub": bridge_relay(urlsplit(hub.url).port),
            "plugin-api": relaying(("127.0.0.1", 0), lambda: ready_endpoints(admin, NAMESPACE, API_SERVICE)),
        }
        yield {name: stack.enter_context(relay) for name, relay in relays.items()}


def connection_secrets(database: dict, redis_url: str, relays: dict) -> list[dict]:
    """The Secrets the chart reads PostgreSQL's and Redis's URLs from, pointing at their bridge relays."""
    d = database
    pg = f"postgres://{d['USER']}:{d.get('PASSWORD') or ''}@{BRIDGE_ADDRESS}:{relays['postgres'].port}/{d['NAME']}"
    redis = urlsplit(redis_url)
    credentials = redis.netloc.rpartition("@")[0]
    redis = redis._replace(netloc=f"{credentials}{'@' if credentials else ''}{BRIDGE_ADDRESS}:{relays['redis'].port}")
    secrets = {"gpustack-models-database": pg, "gpustack-models-redis": urlunsplit(redis)}
    return [
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": {"url": url}}
        for name, url in secrets.items()
    ]


def adopt_shared_objects(release: ChartRelease) -> list[str]:
    """The render's objects outside the release's namespace that exist already (the suite's, under the
    chart's names: cluster-wide ones and a RoleBinding in kube-system) get Helm's ownership metadata, so the
    install takes them over; returns them."""
    text = release.helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(release.values)).stdout
    by_namespace: dict[str, list[str]] = {}
    for obj in (o for o in yaml.safe_load_all(text) if o):
        hook = (obj["metadata"].get("annotations") or {}).get("helm.sh/hook")
        if not hook and obj["metadata"].get("namespace") != NAMESPACE:
            group = obj["apiVersion"].rpartition("/")[0]
            name = f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']}"
            by_namespace.setdefault(obj["metadata"].get("namespace", ""), []).append(name)
    adopted = []
    for namespace, names in by_namespace.items():
        where = ["-n", namespace] if namespace else []
        found = release.kubectl("get", *where, *names, "--ignore-not-found", "-o", "name").stdout.split()
        if found:
            release.kubectl("annotate", *where, "--overwrite", *found, *(f"{k}={v}" for k, v in OWNER.items()))
            release.kubectl("label", *where, "--overwrite", *found, "app.kubernetes.io/managed-by=Helm")
        adopted += found
    return adopted


class ChartRelease:
    """helm install/uninstall of the release, with the API Service's relay for as long as it is installed."""

    def __init__(self, helm: str, cluster, launcher, real_node, values: dict):
        self.helm_bin, self.cluster, self.launcher, self.real_node = helm, cluster, launcher, real_node
        self.admin = launcher.admin
        self.values = TEST_STATE / "chart-release-values.json"
        self.values.write_text(json.dumps(values))
        self.api_relay: contextlib.ExitStack | None = None

    def helm(self, *args: str, check: bool = True):
        return run_helm(self.helm_bin, *args, kubeconfig=self.cluster.kubeconfig, check=check)

    def kubectl(self, *args: str, **kwargs):
        return self.real_node.kubectl(*args, **kwargs)

    def install(self) -> float:
        """helm install, then until every role is available and so is the APIService; returns the seconds."""
        t0 = time.monotonic()
        self.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "-f", str(self.values), "--timeout", "180s")
        self.api_relay = contextlib.ExitStack()
        self.api_relay.enter_context(service_relay(self.admin, NAMESPACE, API_SERVICE))
        self.wait_healthy()
        seconds = time.monotonic() - t0
        restarted = {
            f"{p['metadata']['name']}/{c['name']}": c["restartCount"]
            for p in self.admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            for c in (p.get("status") or {}).get("containerStatuses") or []
            if c["restartCount"]
        }
        assert restarted == {}, f"containers of the release restarted: {restarted}"
        return seconds

    def uninstall(self, check: bool = True):
        """helm uninstall (its pre-delete hook included), waiting for the release's objects to go."""
        try:
            return self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "240s", check=check)
        finally:
            if self.api_relay is not None:
                self.api_relay.close()
                self.api_relay = None

    def deployments(self) -> list[dict]:
        return self.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments")["items"]

    def roles_available(self) -> bool:
        deployments = self.deployments()
        plugins = self.admin.get(f"/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets")["items"]
        return (
            len(deployments) == 4
            and all((d.get("status") or {}).get("availableReplicas") == d["spec"]["replicas"] for d in deployments)
            and all((d.get("status") or {}).get("updatedReplicas") == d["spec"]["replicas"] for d in deployments)
            and len(plugins) == 1
            and (plugins[0].get("status") or {}).get("numberReady") == 1
        )

    def wait_healthy(self, timeout: float = 240) -> None:
        try:
            wait_for(self.roles_available, timeout=timeout, interval=1, message="every role of the release available")
            self.launcher.wait_available(timeout=60)
        except (AssertionError, RuntimeError) as exc:
            pods = self.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide", check=False).stdout
            events = self.kubectl("get", "events", "-n", NAMESPACE, check=False).stdout[-4000:]
            raise AssertionError(f"{exc}\n{pods}\n{events}") from None

    def remove(self) -> None:
        """Uninstall if installed, until the plugin's Pods are gone too, and delete the namespace."""
        if self.helm("status", RELEASE, "--namespace", NAMESPACE, check=False).returncode == 0:
            self.uninstall(check=False)
        plugins = f"/api/v1/namespaces/{NAMESPACE}/pods"
        query = {"labelSelector": "app.kubernetes.io/name=gpustack-models-plugin"}
        wait_for(lambda: not self.admin.get(plugins, query=query)["items"], timeout=120, message="plugin Pods gone")
        self.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=60s", check=False)


def restore_suite(launcher, worker_api) -> None:
    """The suite's cluster-wide objects and its APIService back, as the session had them."""
    launcher.install()
    launcher.register(worker_api.port)
    launcher.wait_available()


@pytest.fixture(scope="module")
def chart_release(helm, product_image, real_node, cluster, launcher, worker_api, hub, django_db_blocker):
    """The chart installed on the real node and healthy (see the module's docstring); uninstalled after."""
    t0 = time.monotonic()
    import_image(product_image, real_node)
    with contextlib.ExitStack() as stack:
        stack.enter_context(without_session_stack())
        stack.callback(restore_suite, launcher, worker_api)
        launcher.unregister()
        database = stack.enter_context(own_database(django_db_blocker))
        redis_url = own_broker(REDIS_INDEX)
        relays = stack.enter_context(host_relays(launcher.admin, cluster, database, redis_url, hub))
        release = ChartRelease(helm, cluster, launcher, real_node, release_values(real_node, cluster, hub, relays))
        stack.callback(release.remove)
        release.kubectl("create", "namespace", NAMESPACE, check=False)  # (left by a session that died)
        secrets = yaml.safe_dump_all(connection_secrets(database, redis_url, relays))
        release.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=secrets)
        adopted = adopt_shared_objects(release)
        seconds = release.install()
        print(f"[chart release] adopted {len(adopted)} objects; installed and healthy in {seconds:.1f}s "
              f"({time.monotonic() - t0:.1f}s with the image import)")  # fmt: skip
        yield release
