"""Hostile names, query parameters and bodies against the v1 API, through kube-apiserver and straight to the
worker: each answers a 4xx Status and changes nothing."""

import re
import statistics
import time

import pytest
import requests
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from tests.support import wait_for
from tests.test_api_authz import CLIENTS, _client, bind, create_artifact, make_namespace

STORAGE = f"/apis/{GROUP}/v1alpha1"
HOSTILE_NAMES = [".", "%2E", "..", "%2E%2E", "a%2Fb", "x%3Fwatch%3Dtrue", "x%23y", "%25", "x%3F", "UPPER"]


@pytest.fixture(scope="module")
def victims(worker_api, core, api_client, worker_kube):
    """A namespace with two artifacts; dave (the attacker) may get, list, watch, create, patch and delete
    artifacts there, carol may only list them."""
    namespace = make_namespace(core, "victims")
    for name in ("one", "two"):
        create_artifact(worker_kube, namespace, name)
    rules = [
        k8s.V1PolicyRule(
            api_groups=[GROUP],
            resources=["modelartifacts"],
            verbs=["get", "list", "watch", "create", "patch", "delete"],
        )
    ]
    bind(api_client, namespace, "User", "dave", rules, name="attacker")
    bind(api_client, namespace, "User", "carol", [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"],
                                                                    verbs=["list"])], name="carol")  # fmt: skip
    yield namespace
    core.delete_namespace(namespace)


def still_there(worker_kube, namespace):
    names = {
        i["metadata"]["name"] for i in worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts")["items"]
    }
    return names == {"one", "two"}


def raw(session, method: str, url: str):
    """Send ``url`` as written: requests would remove ``.`` and ``..`` segments before sending."""
    prepared = session.prepare_request(requests.Request(method, url))
    prepared.url = url
    return session.send(prepared, timeout=10)


def assert_status(resp, codes):
    assert resp.status_code in codes, (resp.status_code, resp.text[:300])
    body = resp.json()
    assert body["kind"] == "Status" and body["code"] == resp.status_code, body


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_it_never_turns_a_hostile_name_into_a_list_or_a_collection_delete(how, name, victims, worker_api, cluster,
                                                                          worker_kube):  # fmt: skip
    session, base = _client(how, worker_api, cluster, "dave")
    url = f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts/{name}"
    wait_for(lambda: session.get(f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts/one").status_code == 200,
             timeout=15, message="dave's Role to take effect")  # fmt: skip
    # 400 or 404 from the worker; kube-apiserver may refuse first (403: it reads "a%2Fb" as a subresource).
    got = raw(session, "GET", url)
    assert_status(got, (400, 403, 404))
    deleted = raw(session, "DELETE", url)
    assert_status(deleted, (400, 403, 404, 405))
    assert still_there(worker_kube, victims)


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("query", ["watch=on", "watch=", "watch=true&watch=false", "watch=yes&watch=0"])
def test_it_refuses_every_form_of_watch_to_a_list_only_subject(how, query, victims, worker_api, cluster):
    session, base = _client(how, worker_api, cluster, "carol")
    url = f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts"
    wait_for(lambda: session.get(url).status_code == 200, timeout=15, message="carol's Role to take effect")
    resp = session.get(f"{url}?{query}", stream=True, timeout=10)
    try:
        assert_status(resp, (403,))
    finally:
        resp.close()


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("query", ["watch=false", "watch=0", "watch=false&watch=true", "watch=FALSE"])
def test_it_lists_where_kube_apiserver_lists(how, query, victims, worker_api, cluster):
    session, base = _client(how, worker_api, cluster, "carol")
    url = f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts"
    wait_for(lambda: session.get(url).status_code == 200, timeout=15, message="carol's Role to take effect")
    resp = session.get(f"{url}?{query}", timeout=10)
    assert resp.status_code == 200, resp.text
    assert resp.json()["kind"] == "ModelArtifactList" and len(resp.json()["items"]) == 2


def test_it_lets_a_legitimate_name_through(victims, worker_api, cluster):
    session, base = _client(CLIENTS[0], worker_api, cluster, "dave")
    resp = session.get(f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts/one")
    assert resp.status_code == 200 and resp.json()["metadata"]["name"] == "one"


HEAD = ["apiVersion: worker.gpustack.ai/v1", "kind: ModelArtifact", "metadata: {name: bomb}"]
LEVELS = [f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")]
BOMB = "\n".join([*HEAD, 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]', *LEVELS]).encode()
# The same document, as long, without anchors and aliases: an ordinary body the API refuses (no spec).
PLAIN = re.sub(rb"&\w ", b"   ", BOMB).replace(b"*", b" ")


def api_rss(worker_api) -> int:
    """Resident bytes of the API's processes (gunicorn's master and its workers)."""
    pids = [worker_api.proc.pid]
    children = f"/proc/{worker_api.proc.pid}/task/{worker_api.proc.pid}/children"
    pids += [int(p) for p in open(children).read().split()]
    total = 0
    for pid in pids:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                total += int(line.split()[1]) * 1024
    return total


def timed(session, method: str, url: str, body: bytes, content_type: str):
    started = time.monotonic()
    resp = session.request(method, url, data=body, headers={"Content-Type": content_type}, timeout=10)
    return resp, time.monotonic() - started


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
def test_it_refuses_a_yaml_alias_bomb_at_once_without_growing(how, victims, worker_api, cluster):
    assert len(BOMB) < 1024
    session, base = _client(how, worker_api, cluster, "dave")
    url = f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts"
    before = api_rss(worker_api)
    for method, target, content_type in [
        ("POST", url, "application/yaml"),
        ("PATCH", f"{url}/one", "application/apply-patch+yaml"),
    ]:
        # Side by side, the same request with the plain document of the same size: refused "at once" is
        # refused as fast as an ordinary body (expanding the bomb would take seconds and gigabytes). The
        # bomb's fastest against the plain one's median: a pause of the machine does not count against it.
        bomb, plain = [], []
        for _ in range(3):
            resp, elapsed = timed(session, method, target, PLAIN, content_type)
            assert 400 <= resp.status_code < 500 and resp.json()["kind"] == "Status", resp.text[:300]
            plain.append(elapsed)
            resp, elapsed = timed(session, method, target, BOMB, content_type)
            assert resp.status_code == 400, resp.text[:300]
            assert resp.json()["kind"] == "Status" and "aliases" in resp.json()["message"], resp.text[:300]
            bomb.append(elapsed)
        assert min(bomb) <= 2 * statistics.median(plain), (bomb, plain)
    assert api_rss(worker_api) - before < 50 * 1024 * 1024


@pytest.mark.parametrize("how", CLIENTS, ids=lambda f: f.__name__)
def test_it_answers_a_watch_from_a_malformed_resource_version_with_400(how, victims, worker_api, cluster):
    session, base = _client(how, worker_api, cluster, "dave")
    url = f"{base}/apis/{GROUP}/v1/namespaces/{victims}/modelartifacts"
    wait_for(lambda: session.get(url).status_code == 200, timeout=15, message="dave's Role")
    # "¹" and "٣" are digits to Python's str.isdigit, not to kube-apiserver's ParseUint (the fuzz test found "¹").
    for version in ("y~F", "¹", "٣"):
        resp = session.get(url, params={"watch": "true", "resourceVersion": version}, timeout=10)
        assert_status(resp, (400,))
        listed = session.get(url, params={"resourceVersion": version}, timeout=10)  # a list, too
        assert_status(listed, (400,))
