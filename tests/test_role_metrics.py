"""Every role's Prometheus metrics, scraped from the real processes after real work.

The API (the suite's ``runapiserver`` with two gunicorn workers) serves ``/metrics`` on its HTTPS port to
authenticated callers allowed ``get /metrics`` only; the session's informers, Celery worker (prefork, four
processes) and Celery beat serve it over plain HTTP on their ``GPUSTACK_METRICS_PORT``. Counters are read
before and after the work, so what moved is what the test did (or at least that: kube-controller-manager
also lists and watches the API's resources, and beat keeps sending its periodic tasks)."""

from __future__ import annotations

import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
import requests
from kubernetes import client as k8s
from prometheus_client.parser import text_string_to_metric_families

from gpustack_models.kinds import GROUP
from gpustack_models.local.cluster import free_port
from gpustack_models.telemetry.registry import multiprocess_root
from tests.plugin.attackers import SlowClient
from tests.support import wait_for
from tests.support.paths import TEST_STATE
from tests.support.worker import METRICS_MAX_CONNECTIONS, METRICS_REQUEST_SECONDS, WorkerAPI, database_url

V1 = f"/apis/{GROUP}/v1"
STORAGE = f"/apis/{GROUP}/v1alpha1"
ROLES = ("informers", "celery", "beat")


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition, by name and labels."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def value(scraped: dict, name: str, **labels) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


def matching(scraped: dict, name: str, **labels) -> dict[frozenset, float]:
    """The samples of ``name`` whose labels include ``labels``."""
    wanted = set(labels.items())
    return {key: v for (n, key), v in scraped.items() if n == name and wanted <= key}


class Roles:
    """The session's informers, Celery worker and beat, on their metrics ports."""

    def __init__(self, stack):
        self.stack = stack
        self.ports = stack.metrics_ports

    def url(self, name: str, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.ports[name]}{path}"

    def scrape(self, name: str) -> str:
        assert self.stack.procs[name].poll() is None, f"{name} exited; see {TEST_STATE / f'{name}.log'}"
        resp = requests.get(self.url(name), timeout=5)
        assert resp.status_code == 200, resp.text
        return resp.text


def _answers(roles: Roles, name: str) -> bool:
    try:
        return bool(roles.scrape(name))
    except requests.RequestException:
        return False


@pytest.fixture(scope="module")
def roles(worker_stack):
    """The session's worker roles (they serve metrics as a deployment's do), once each answers."""
    stack = Roles(worker_stack)
    for name in ROLES:
        wait_for(lambda n=name: _answers(stack, n), timeout=60, message=f"the {name} metrics port")
    return stack


@pytest.fixture(scope="module")
def tenant_ns(core):
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    yield name
    core.delete_namespace(name)


def admin(worker_api, cluster):
    """kube-apiserver's front proxy asserting a system:masters user, straight to the worker."""
    cert = (str(cluster.pki_path("front-proxy-client.crt")), str(cluster.pki_path("front-proxy-client.key")))
    headers = {"X-Remote-User": "metrics-admin", "X-Remote-Group": "system:masters"}
    return worker_api.session(cert=cert, headers=headers)


def scrape_api(worker_api, cluster) -> str:
    resp = admin(worker_api, cluster).get(f"{worker_api.url}/metrics", timeout=10)
    assert resp.status_code == 200, resp.text
    return resp.text


def artifact(name: str, repository: str, version: str = "v1") -> dict:
    return {
        "apiVersion": f"{GROUP}/{version}",
        "kind": "ModelArtifact",
        "metadata": {"name": name},
        "spec": {"source": {"huggingFace": {"repository": repository}}},
    }


# --- the API ---------------------------------------------------------------------------------------------


@pytest.fixture
def metrics_reader(api_client):
    """carol may ``get /metrics`` through a ClusterRole; nobody else of the tenants may."""
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    name = f"metrics-reader-{uuid.uuid4().hex[:6]}"
    rule = k8s.V1PolicyRule(non_resource_urls=["/metrics"], verbs=["get"])
    rbac.create_cluster_role(k8s.V1ClusterRole(metadata=k8s.V1ObjectMeta(name=name), rules=[rule]))
    rbac.create_cluster_role_binding(
        k8s.V1ClusterRoleBinding(
            metadata=k8s.V1ObjectMeta(name=name),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="ClusterRole", name=name),
            subjects=[k8s.RbacV1Subject(kind="User", name="carol", api_group="rbac.authorization.k8s.io")],
        )
    )
    yield "carol"
    rbac.delete_cluster_role_binding(name)
    rbac.delete_cluster_role(name)


def test_the_api_serves_metrics_only_to_callers_allowed_get_metrics(worker_api, cluster, metrics_reader):
    url = f"{worker_api.url}/metrics"
    anonymous = worker_api.session().get(url, timeout=10)
    assert anonymous.status_code == 401, anonymous.text
    assert anonymous.json()["kind"] == "Status" and anonymous.json()["code"] == 401

    tenant = worker_api.session(token=cluster.tokens()["alice"]).get(url, timeout=10)
    assert tenant.status_code == 403, tenant.text
    assert tenant.json()["kind"] == "Status" and 'cannot get path "/metrics"' in tenant.json()["message"]
    assert "gpustack_models" not in tenant.text

    forged = worker_api.session(token="not-a-token").get(url, timeout=10)
    assert forged.status_code == 401, forged.text

    reader = worker_api.session(token=cluster.tokens()[metrics_reader])  # one connection: one worker's caches

    def allowed():  # the ClusterRole reaches the authorizer within moments
        return reader.get(url, timeout=10)

    wait_for(lambda: allowed().status_code == 200, timeout=30, message="carol's ClusterRole to allow /metrics")
    answer = allowed()
    assert answer.headers["Content-Type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(answer.text)}
    for family in (
        "gpustack_models_api_requests",
        "gpustack_models_api_request_duration_seconds",
        "gpustack_models_api_auth_cache_requests",
    ):
        assert family in names, sorted(names)
    scraped = samples(answer.text)
    # The refusals above were counted too, under the route and their codes.
    assert value(scraped, "gpustack_models_api_requests_total", verb="get", resource="/metrics", code="401") >= 2
    assert value(scraped, "gpustack_models_api_requests_total", verb="get", resource="/metrics", code="403") >= 1
    assert value(scraped, "gpustack_models_api_auth_cache_requests_total", cache="tokenreview", result="miss") >= 1
    assert value(scraped, "gpustack_models_api_auth_cache_requests_total", cache="tokenreview", result="hit") >= 1
    assert (
        value(scraped, "gpustack_models_api_auth_cache_requests_total", cache="subjectaccessreview", result="miss") >= 1
    )


def test_the_api_counts_requests_by_verb_resource_and_code(worker_api, cluster, tenant_ns):
    before = samples(scrape_api(worker_api, cluster))
    name = f"counted-{uuid.uuid4().hex[:6]}"
    base = f"{worker_api.url}{V1}/namespaces/{tenant_ns}/modelartifacts"
    codes = {}
    # A fresh connection per request, so both gunicorn workers serve some.
    codes["create"] = admin(worker_api, cluster).post(base, json=artifact(name, "org/counted"), timeout=10)
    codes["get"] = admin(worker_api, cluster).get(f"{base}/{name}", timeout=10)
    codes["missing"] = admin(worker_api, cluster).get(f"{base}/no-such-{name}", timeout=10)
    codes["list"] = admin(worker_api, cluster).get(base, timeout=10)
    codes["progress"] = admin(worker_api, cluster).get(f"{base}/{name}/progress", timeout=10)
    codes["watch"] = admin(worker_api, cluster).get(f"{base}?watch=true&timeoutSeconds=1", timeout=20)
    codes["unknown"] = admin(worker_api, cluster).get(f"{worker_api.url}{V1}/namespaces/{tenant_ns}/foos", timeout=10)
    codes["status"] = admin(worker_api, cluster).get(f"{base}/{name}/status", timeout=10)
    for _ in range(16):
        assert admin(worker_api, cluster).get(f"{worker_api.url}/apis", timeout=10).status_code == 200
    codes["delete"] = admin(worker_api, cluster).delete(f"{base}/{name}", timeout=10)
    expected = {
        "create": (201, "create", "modelartifacts"),
        "get": (200, "get", "modelartifacts"),
        "missing": (404, "get", "modelartifacts"),
        "list": (200, "list", "modelartifacts"),
        "progress": (200, "get", "modelartifacts/progress"),
        "watch": (200, "watch", "modelartifacts"),
        "unknown": (404, "list", "unknown"),
        "status": (404, "get", "modelartifacts/status"),
        "delete": (200, "delete", "modelartifacts"),
    }
    for what, (code, _, _) in expected.items():
        assert codes[what].status_code == code, f"{what}: {codes[what].status_code} {codes[what].text[:300]}"
    text = scrape_api(worker_api, cluster)
    after = samples(text)
    metric = "gpustack_models_api_requests_total"
    for what, (code, verb, resource) in expected.items():
        moved = value(after, metric, verb=verb, resource=resource, code=str(code)) - value(
            before, metric, verb=verb, resource=resource, code=str(code)
        )
        assert moved >= 1, f"{what}: {verb} {resource} {code} did not move"
    apis = value(after, metric, verb="get", resource="/apis", code="200") - value(
        before, metric, verb="get", resource="/apis", code="200"
    )
    assert apis >= 16, apis
    duration = "gpustack_models_api_request_duration_seconds_count"
    assert value(after, duration, verb="create", resource="modelartifacts") > value(
        before, duration, verb="create", resource="modelartifacts"
    )
    # Bounded labels: no namespace, no object name.
    assert tenant_ns not in text and name not in text and "foos" not in text


def children(pid: int) -> set[int]:
    """The live processes whose parent is ``pid``."""
    found = set()
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[1]) == pid and fields[0] not in ("Z", "X"):
            found.add(int(entry.name))
    return found


@pytest.fixture
def own_api(launcher, django_db_setup, django_db_blocker):
    """An API server of this test's own (not registered: only this test calls it), two workers."""
    with django_db_blocker.unblock():
        url = database_url()
    api = WorkerAPI(launcher, free_port(), url)
    api.start()
    try:
        yield api
    finally:
        api.stop()


def test_one_scrape_of_the_api_sums_its_workers_those_replaced_included(own_api, cluster):
    def get_apis(times: int) -> None:
        for _ in range(times):  # a fresh connection each
            assert admin(own_api, cluster).get(f"{own_api.url}/apis", timeout=10).status_code == 200

    def apis_count() -> float:
        return value(
            samples(scrape_api(own_api, cluster)),
            "gpustack_models_api_requests_total",
            verb="get",
            resource="/apis",
            code="200",
        )

    directory = multiprocess_root() / f"api-{own_api.proc.pid}"
    get_apis(10)
    assert apis_count() == 10
    served = {int(p.stem.split("_")[1]) for p in directory.glob("counter_*.db")}
    # A worker may already have been replaced before this point (CI once showed a counter file of a pid no
    # longer among the workers): its counts are in the ten all the same. The live ones that counted die now.
    alive = served & children(own_api.proc.pid)
    assert alive, (served, children(own_api.proc.pid))
    for pid in alive:  # gunicorn starts others
        os.kill(pid, signal.SIGKILL)
    wait_for(
        lambda: len(children(own_api.proc.pid) - served) == 2, timeout=30, message="gunicorn to replace its workers"
    )
    get_apis(10)
    # Nobody else calls this server: exactly the twenty requests, from the dead workers and the new ones.
    assert apis_count() == 20
    now = {int(p.stem.split("_")[1]) for p in directory.glob("counter_*.db")}
    assert served < now, (served, now)


# --- the informers, the Celery worker, beat ---------------------------------------------------------------


def condition_reason(worker_kube, namespace: str, name: str) -> str | None:
    obj = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}")
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Resolved":
            return condition.get("reason") if condition.get("status") in ("True", "False") else None
    return None


def test_the_worker_roles_count_their_work(roles, hub, worker_kube, tenant_ns):
    before = {name: samples(roles.scrape(name)) for name in ROLES}
    repository = f"org/metered-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repository, {"config.json": b"{}"})
    good, bad = f"metered-{uuid.uuid4().hex[:6]}", f"missing-{uuid.uuid4().hex[:6]}"
    worker_kube.create(f"{STORAGE}/namespaces/{tenant_ns}/modelartifacts", artifact(good, repository, "v1alpha1"))
    worker_kube.create(
        f"{STORAGE}/namespaces/{tenant_ns}/modelartifacts",
        artifact(bad, f"org/nowhere-{uuid.uuid4().hex[:6]}", "v1alpha1"),
    )
    wait_for(lambda: condition_reason(worker_kube, tenant_ns, good) is not None, timeout=60, message="the resolution")
    wait_for(lambda: condition_reason(worker_kube, tenant_ns, bad) is not None, timeout=60, message="the failure")
    reason = condition_reason(worker_kube, tenant_ns, bad)
    assert condition_reason(worker_kube, tenant_ns, good) == "Resolved"

    def moved(role, name, **labels):
        return value(samples(roles.scrape(role)), name, **labels) - value(before[role], name, **labels)

    resolve = "gpustack_models.resolve_artifact"
    wait_for(lambda: moved("celery", "gpustack_models_resolutions_total", outcome="resolved", reason="") >= 1)
    wait_for(lambda: moved("celery", "gpustack_models_resolutions_total", outcome="failed", reason=reason) >= 1)
    wait_for(lambda: moved("celery", "gpustack_models_tasks_total", task=resolve, outcome="success") >= 2)
    wait_for(lambda: moved("celery", "gpustack_models_task_duration_seconds_count", task=resolve) >= 2)
    # Mirror lag: observed when the informers' batches committed.
    wait_for(lambda: moved("celery", "gpustack_models_mirror_lag_seconds_count", resource="modelartifacts") >= 2)
    wait_for(
        lambda: (
            moved("celery", "gpustack_models_tasks_total", task="gpustack_models.mirror_events", outcome="success") >= 1
        )
    )
    celery = samples(roles.scrape("celery"))
    assert matching(celery, "gpustack_models_queue_depth", queue="celery"), "no queue depth for the celery queue"

    informers = "gpustack_models_informer_events_total"
    wait_for(lambda: moved("informers", informers, resource="modelartifacts", type="ADDED") >= 2)
    wait_for(lambda: moved("informers", informers, resource="modelartifacts", type="MODIFIED") >= 2)
    assert moved("informers", "gpustack_models_informer_batches_sent_total", resource="modelartifacts") >= 1
    assert moved("informers", "gpustack_models_tasks_sent_total", task="gpustack_models.mirror_events") >= 1
    informer_text = roles.scrape("informers")
    for family in ("gpustack_models_informer_relists", "gpustack_models_informer_watch_restarts"):
        assert f"# TYPE {family}_total counter" in informer_text or f"# TYPE {family} counter" in informer_text

    # Beat sends the collection pass every 2 s here (COLLECTION_INTERVAL, tests/support/worker.py).
    wait_for(lambda: moved("beat", "gpustack_models_tasks_sent_total", task="gpustack_models.collect") >= 2)
    wait_for(
        lambda: moved("celery", "gpustack_models_tasks_total", task="gpustack_models.collect", outcome="success") >= 1
    )

    # Nothing tenant-named or secret in any label.
    for name in ROLES:
        text = roles.scrape(name)
        for secret in (tenant_ns, good, bad, repository):
            assert secret not in text, f"{secret} in the {name} metrics"


def test_the_metrics_port_answers_get_metrics_only_and_a_silent_client_stops_no_scrape(roles):
    for method, path in (
        ("GET", "/"),
        ("GET", "/metrics/x"),
        ("POST", "/metrics"),
        ("PUT", "/metrics"),
        ("GET", "/admin/"),
    ):
        resp = requests.request(method, roles.url("celery", path), timeout=5)
        assert resp.status_code == 404, (method, path, resp.status_code)
    silent = []
    try:
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", roles.ports["celery"]), timeout=5)
            silent.append(sock)
        half = socket.create_connection(("127.0.0.1", roles.ports["celery"]), timeout=5)
        half.sendall(b"GET /metr")  # a request line that never ends
        silent.append(half)
        resp = requests.get(roles.url("celery"), timeout=5)
        assert resp.status_code == 200 and "gpustack_models_tasks_total" in resp.text
        # Answered while every silent client still held its connection: the scrape did not wait for the
        # server to give up on them (it drops a silent connection after METRICS_REQUEST_SECONDS).
        for sock in silent:
            sock.setblocking(False)
            try:
                data = sock.recv(1)
            except BlockingIOError:
                continue  # open, nothing said to it
            raise AssertionError(f"a silent client was answered or dropped before the scrape: {data!r}")
    finally:
        for sock in silent:
            sock.close()


def _scrape_once(roles: Roles, name: str):
    """``(status, seconds)`` of one scrape on a new connection; the error's name for the status when it fails."""
    started = time.monotonic()
    try:
        status = requests.get(roles.url(name), timeout=5, headers={"Connection": "close"}).status_code
    except requests.RequestException as exc:
        status = type(exc).__name__
    return status, time.monotonic() - started


def test_a_client_trickling_its_request_a_byte_a_second_is_cut_at_the_deadline_while_scrapes_answer(roles):
    port = roles.ports["informers"]
    rounds = [_scrape_once(roles, "informers") for _ in range(3)]
    assert [status for status, _ in rounds] == [200] * 3, rounds
    late = 0.5 + 2 * max(seconds for _, seconds in rounds)  # how late this machine may be to notice a deadline
    trickle = b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nX-Slow: " + b"a" * 600  # never ends its headers
    slow = SlowClient(("127.0.0.1", port), trickle, tls=False, interval=1.0)
    slow.start()
    answers = []
    while slow.is_alive() and len(answers) < 100:
        answers.append(_scrape_once(roles, "informers"))
        time.sleep(0.2)
    slow.join(METRICS_REQUEST_SECONDS + late + 1)
    slow.stop()
    # Cut at the deadline of the whole head (it sent a byte each second until then, each read well within
    # any per-read timeout), noticed at its next byte; scrapes answered all along.
    assert slow.cut_after is not None, f"not cut after {METRICS_REQUEST_SECONDS + late + 1:.1f} s ({slow.sent} bytes)"
    assert METRICS_REQUEST_SECONDS <= slow.cut_after <= METRICS_REQUEST_SECONDS + late + 1, (slow.cut_after, late)
    assert slow.sent >= METRICS_REQUEST_SECONDS - 1, slow.sent
    assert len(answers) >= 3 and [a for a in answers if a[0] != 200] == [], answers


def test_connections_beyond_the_bound_are_closed_at_once_and_a_scrape_answers_once_they_close(roles):
    port = roles.ports["beat"]
    assert _scrape_once(roles, "beat")[0] == 200
    held = []
    try:
        # Up to the bound, each holding a thread (the scrape above may hold one a moment longer: then the
        # first beyond takes its place).
        held = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(METRICS_MAX_CONNECTIONS)]
        started = time.monotonic()
        beyond = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(10)]
        closed = [sock.recv(1) for sock in beyond[1:]]  # the first may have taken the scrape's place
        # Closed by the accept loop at once, unread: long before any deadline would have closed them.
        assert closed == [b""] * 9 and time.monotonic() - started < METRICS_REQUEST_SECONDS / 2
        assert _scrape_once(roles, "beat")[0] != 200  # full: a scrape is closed at once too
        for sock in beyond + held[:2]:
            sock.close()
        wait_for(lambda: _scrape_once(roles, "beat")[0] == 200, timeout=METRICS_REQUEST_SECONDS / 2, interval=0.05)
    finally:
        for sock in held:
            sock.close()


def test_the_api_counts_placement_reviews_by_outcome(worker_api, cluster, tenant_ns, tmp_path):
    from django.conf import settings

    from tests.test_placement import PATH, client_cert, model_pod, review

    session = worker_api.session(cert=client_cert(cluster, tmp_path, settings.PLACEMENT_CALLER))
    before = samples(scrape_api(worker_api, cluster))
    pods = [{"kind": "Pod", "spec": {"containers": []}}, model_pod("p", "not-resolved")]
    for pod in pods:
        resp = session.post(f"{worker_api.url}{PATH}", json=review(tenant_ns, pod), timeout=10)
        assert resp.status_code == 200 and "patch" not in resp.json()["response"], resp.text
    malformed = session.post(f"{worker_api.url}{PATH}", json={"kind": "Pod"}, timeout=10)
    assert malformed.status_code == 400, malformed.text
    after = samples(scrape_api(worker_api, cluster))

    def moved(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("gpustack_models_placement_webhook_calls_total", outcome="unchanged") >= 2
    requests_total = "gpustack_models_api_requests_total"
    assert moved(requests_total, verb="post", resource="/internal/v1/placement", code="200") >= 2
    assert moved(requests_total, verb="post", resource="/internal/v1/placement", code="400") == 1
