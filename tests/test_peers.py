"""Peer endpoints of real node plugins (``gpustack_models.plugin``): what a node holds, served to the plugins of
nodes that want it (and to no one else), byte-exact, within the node's upload limits; the tickets that list
them."""

import http.client
import json
import ssl
import threading
import time
import uuid
from pathlib import Path

import pytest
import requests
from django.utils import timezone

from gpustack_models.internal.tickets import peer_sources
from gpustack_models.local import pki
from gpustack_models.models import (
    Artifact,
    EntryState,
    Holding,
    MountReference,
    NodeStore,
    PluginPod,
    Prefetch,
    PrefetchTarget,
    StoreEntry,
    TargetState,
)
from gpustack_models.plugin.peers.contract import file_url, tree_url
from tests.support import PEER_PORT, wait_for
from tests.support.kubernetes import wait_default_service_account
from tests.support.plugins import client_cert, service_client_cert
from tests.support.uploads import limit_uploads
from tests.test_plugins import big_files, launcher_token, service_kubeconfig_token

PEER_AUDIENCE = "gpustack-models-peer"  # the audience plugins' peer tokens had: no plugin takes one now
WEIGHTS = "model.safetensors"


def peer_cert(plugin) -> tuple[str, str]:
    """The plugin's own client certificate for its peers (the API issued it with its serving one)."""
    return client_cert(plugin)


class Peer:
    """A client of one plugin's peer endpoints, checking its certificate against the plugins' CA and
    presenting ``cert`` (a client certificate's (certificate, key) files; ``None``: none)."""

    def __init__(self, plugin, launcher, digest):
        self.plugin, self.digest = plugin, digest
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(launcher.data_dir / "plugin-pki" / "ca.crt")  # a cert for the Pod IP

    def get(self, url, cert=None, token=None, **headers):
        if token:
            headers["Authorization"] = f"Bearer {token}"
        return self.session.get(url, headers=headers, timeout=30, cert=cert)

    def raw(self, method, path, cert):
        """``method path`` exactly as given (a client library would resolve dot segments first)."""
        context = ssl.create_default_context(cafile=self.session.verify)
        context.load_cert_chain(*cert)
        conn = http.client.HTTPSConnection(self.plugin.address, PEER_PORT, context=context, timeout=30)
        try:
            conn.request(method, path)
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def tree(self, cert, token=None):
        return self.get(tree_url(self.plugin.peer_url, self.digest), cert, token)

    def file(self, path, cert, byte_range=None, token=None):
        headers = {"Range": byte_range} if byte_range else {}
        return self.get(file_url(self.plugin.peer_url, self.digest, path), cert, token, **headers)


def handshake_refused(call) -> bool:
    """Whether ``call()`` (a request) is refused at the TLS handshake: no answer at all."""
    try:
        call()
    except requests.exceptions.ConnectionError:  # SSLError included: the server's alert, or its close
        return True
    return False


def metric(plugin, name: str, **labels) -> float:
    s = requests.Session()
    s.trust_env = False
    text = s.get(f"{plugin.url}/metrics", verify=False, timeout=10).text
    selector = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))  # as prometheus_client writes them
    wanted = f"{name}{{{selector}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0


def status_of(resp) -> tuple[int, str]:
    body = resp.json()
    assert body["kind"] == "Status" and body["code"] == resp.status_code, body
    return resp.status_code, body["reason"]


def tenant_peer_token(launcher, namespace) -> str:
    """A tenant's own ServiceAccount token for the peer audience: any tenant can ask kube-apiserver for one."""
    wait_default_service_account(launcher.admin, namespace)
    answer = launcher.admin.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/default/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"audiences": [PEER_AUDIENCE]}},
    )
    return answer["status"]["token"]


def test_it_serves_a_ready_tree_byte_exact_to_a_node_that_wants_it_and_lists_it_in_tickets(
    scenario, launcher, worker_api, core
):
    scenario.artifact(files=big_files(scenario.repo, mb=3))
    a, b = scenario.plugins(2, GPUSTACK_PLUGIN_FANOUT="false")  # each from the hub: the bytes below are ours alone
    limit_uploads(core, scenario.kube, a, connections=1, bytes_per_second=1_000_000)  # a's Node's annotations
    scenario.prefetch([a, b])
    scenario.wait_state(a.node, "Ready", timeout=90)
    scenario.wait_state(b.node, "Ready", timeout=90)
    peer, cert = Peer(a, launcher, scenario.digest), peer_cert(b)
    tree = peer.tree(cert)
    assert tree.status_code == 200, tree.text
    files = scenario.files
    expected = [{"path": p, "size": len(files[p]), "have": [[0, len(files[p])]]} for p in sorted(files)]
    assert tree.json() == {"digest": scenario.digest, "state": "Ready", "files": expected}
    weights = files[WEIGHTS]
    served = metric(a, "gpustack_models_plugin_peer_served_bytes_total", peer=b.node) or 0  # b's own download took some
    for asked, (start, end) in {
        "bytes=1000-1999": (1000, 2000),
        f"bytes={len(weights) - 5}-": (len(weights) - 5, len(weights)),
        "bytes=-7": (len(weights) - 7, len(weights)),
        f"bytes=0-{10 * len(weights)}": (0, len(weights)),  # the last byte past the end: up to the end
    }.items():
        got = peer.file(WEIGHTS, cert, asked)
        assert got.status_code == 206, (asked, got.status_code, got.text[:200])
        assert got.content == weights[start:end], asked
        assert got.headers["Content-Range"] == f"bytes {start}-{end - 1}/{len(weights)}"
        served += end - start
    whole = peer.file("config.json", cert)
    assert (whole.status_code, whole.content) == (200, files["config.json"])
    served += len(files["config.json"])
    beyond = peer.file(WEIGHTS, cert, f"bytes={len(weights)}-")
    assert status_of(beyond) == (416, "RequestedRangeNotSatisfiable")
    assert beyond.headers["Content-Range"] == f"bytes */{len(weights)}"
    for malformed in ("bytes=5-3", "bytes=0-1,5-6", "items=0-1", "bytes=-", "bytes=a-b"):
        assert status_of(peer.file(WEIGHTS, cert, malformed)) == (400, "BadRequest"), malformed
    assert metric(a, "gpustack_models_plugin_peer_served_bytes_total", peer=b.node) == served
    assert metric(a, "gpustack_models_plugin_received_bytes_total", source="hub", peer="") == sum(
        len(v) for v in files.values()
    )
    check_upload_limits(peer, cert, weights)
    # The worker's ticket for b lists a, where its peer endpoints are, and never b itself; nor a while its
    # plugin Pod is not Ready.
    listed = {"node": a.node, "url": f"https://{a.address}:{PEER_PORT}", "state": "Ready"}
    assert listed in ticket_peers(worker_api, launcher, b, scenario.digest)
    assert b.node not in [p["node"] for p in ticket_peers(worker_api, launcher, b, scenario.digest)]
    launcher.set_plugin_ready(a.node, a.address, False)
    wait_for(lambda: listed not in ticket_peers(worker_api, launcher, b, scenario.digest), timeout=30,
             message="a's unready plugin to leave the ticket")  # fmt: skip
    launcher.set_plugin_ready(a.node, a.address, True)
    wait_for(lambda: listed in ticket_peers(worker_api, launcher, b, scenario.digest), timeout=30,
             message="a's plugin back in the ticket")  # fmt: skip


def ticket_peers(worker_api, launcher, plugin, digest) -> list[dict]:
    """The ``peers`` of the worker's fetch ticket for ``plugin``'s node."""
    s = worker_api.session(token=launcher_token(plugin))
    ticket = s.post(f"{worker_api.url}/internal/v1/tickets", json={"node": plugin.node, "digest": digest})
    assert ticket.status_code == 200, ticket.text
    return ticket.json()["peers"]


def check_upload_limits(peer, cert, weights):
    """One transfer at a time at 1 MB/s: a second one while it runs is told to come back (503, Retry-After);
    the first one takes the time the rate says."""
    result, size = {}, 2_000_000

    def slow():
        started = time.monotonic()
        result["resp"] = peer.file(WEIGHTS, cert, f"bytes=0-{size - 1}")
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=slow)
    thread.start()
    wait_for(lambda: metric(peer.plugin, "gpustack_models_plugin_peer_uploads") == 1, timeout=10, message="a transfer")
    busy = peer.file("tokenizer.json", cert)
    assert status_of(busy) == (503, "ServiceUnavailable")
    assert busy.headers["Retry-After"] == "1"
    thread.join(30)
    assert result["resp"].status_code == 206 and result["resp"].content == weights[:size]
    # The limiter lets a reader run at most 0.05 s ahead, and the last read (1/20 s worth) goes out at once.
    assert result["seconds"] >= size / 1_000_000 - 0.05 - 0.05, result["seconds"]
    assert peer.file("tokenizer.json", cert).status_code == 200  # the slot is free again
    assert metric(peer.plugin, "gpustack_models_plugin_peer_uploads_limit") == 1


def serving_cert(plugin) -> tuple[str, str]:
    """The plugin's serving certificate and key (of the plugin CA, for serving TLS only)."""
    directory = Path(plugin.env["GPUSTACK_DATA_DIR"]) / "plugin" / plugin.node / "serving-tls"
    return str(directory / "serving.crt"), str(directory / "serving.key")


def foreign_cert(directory: Path, node: str) -> tuple[str, str]:
    """A client certificate naming ``node``'s plugin exactly, from a CA of the same name that is not the
    plugin CA."""
    other = pki.new_ca("gpustack-models-plugin-ca")
    pair = pki.issue(other, f"system:gpustack-models-plugin:{node}", client=True)
    return tuple(str(p) for p in pair.write(directory, f"foreign-{node}"))


def test_it_refuses_everyone_but_the_plugins_of_nodes_that_want_the_digest(scenario, launcher, namespace, tmp_path):
    scenario.artifact()
    a, b, c = scenario.plugins(3)
    scenario.prefetch([a, b])
    scenario.wait_state(a.node, "Ready", timeout=90)
    scenario.wait_state(b.node, "Ready", timeout=90)
    peer = Peer(a, launcher, scenario.digest)
    # No token opens the peer port, not even the wanting plugin's own Pod-bound tokens (one of them, for the
    # peer audience, was what a node showed its peers: any node it reached could replay it to every other).
    b_peer_token = launcher.plugin_token(b.node, audiences=[PEER_AUDIENCE])
    tokens = {
        "the wanting plugin's Pod-bound token for the peer audience": b_peer_token,
        "no credential at all": None,
        "the wanting plugin's kube-apiserver token": launcher_token(b),
        "the worker's own kube-apiserver token": service_kubeconfig_token(launcher),
        "a tenant's token for the peer audience": tenant_peer_token(launcher, namespace),
    }
    for why, token in tokens.items():
        assert handshake_refused(lambda t=token: peer.tree(None, t)), why
        assert handshake_refused(lambda t=token: peer.file(WEIGHTS, None, "bytes=0-9", t)), why
    # Certificates the handshake refuses: the wanting plugin's serving certificate (the plugin CA's, serverAuth
    # only), and one naming that plugin exactly, from another CA.
    for why, cert in {
        "b's serving certificate": serving_cert(b),
        "another CA's": foreign_cert(tmp_path, b.node),
    }.items():
        assert handshake_refused(lambda c=cert: peer.tree(c)), why
    # Client certificates of the plugin CA that are no wanting node's: 403, and nothing said of the digest. A
    # node's own certificate reads what its node wants and nothing more, whatever token rides along.
    refused = {
        "the plugin of a node that does not want the digest": (peer_cert(c), None),
        "... with the wanting plugin's peer token beside it": (peer_cert(c), b_peer_token),
        "the service's (it reads live bytes, not peers)": (service_client_cert(launcher), None),
    }
    for why, (cert, token) in refused.items():
        for resp in (peer.tree(cert, token), peer.file(WEIGHTS, cert, "bytes=0-9", token)):
            assert resp.status_code == 403, (why, resp.status_code, resp.text)
            assert status_of(resp)[1] == "Forbidden", why
            assert scenario.digest not in resp.text, why  # nothing said of what the node holds
    cert = peer_cert(b)
    assert peer.tree(cert).status_code == 200
    # Paths out of the tree, or not in the manifest.
    files = f"/peer/v1/trees/{scenario.digest[7:]}/files/"
    for path in ("../../state/x", "%2e%2e/%2e%2e/state", "a//b", "./config.json", "%00", "%2Fetc%2Fpasswd", "", "%ff"):
        code, body = peer.raw("GET", files + path, cert)
        assert (code, body["reason"]) == (400, "BadRequest"), (path, body)
    for path in ("nothing.bin", "config.json/x", "config.json%2Fx"):
        code, body = peer.raw("GET", files + path, cert)
        assert (code, body["reason"]) == (404, "NotFound"), (path, body)
    for path in (f"/peer/v1/trees/{scenario.digest[7:]}/other", "/peer/v1/trees/../../x", "/peer/v1/trees/ABC"):
        assert peer.raw("GET", path, cert)[0] == 404, path
    # A digest b does not want is refused before anything is said of it; one it wants but c lacks is 404.
    unknown = f"sha256:{uuid.uuid4().hex * 2}"
    assert Peer(a, launcher, unknown).tree(cert).status_code == 403
    assert status_of(Peer(c, launcher, scenario.digest).tree(cert)) == (404, "NotFound")
    # Read-only: no other method changes anything.
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        code, body = peer.raw(method, files + "config.json", cert)
        assert (code, body["reason"]) == (405, "MethodNotAllowed"), method
    assert (scenario.tree(a) / "config.json").read_bytes() == scenario.files["config.json"]


def test_it_tells_and_serves_the_ranges_of_a_download_in_progress(scenario, hub, launcher, worker_api):
    scenario.artifact(files=big_files(scenario.repo, mb=6))
    a, b = scenario.plugins(2, GPUSTACK_PLUGIN_FANOUT="false")  # each from the hub: a's bytes from the first on
    throttle = hub.faults.throttle(scenario.weights, 700_000)  # ~9 s, until released below
    scenario.prefetch([a, b])
    peer, cert = Peer(a, launcher, scenario.digest), peer_cert(b)
    weights = scenario.files[WEIGHTS]

    def partway():
        resp = peer.tree(cert)
        if resp.status_code != 200 or resp.json()["state"] != "Downloading":
            return None
        have = {f["path"]: f["have"] for f in resp.json()["files"]}
        ranges = have[WEIGHTS]
        return ranges if ranges and 2_000_000 <= ranges[0][1] < len(weights) else None

    have = wait_for(partway, timeout=60, interval=0.3, message="a's download part-way")
    downloading = {"node": a.node, "url": f"https://{a.address}:{PEER_PORT}", "state": "Downloading"}
    wait_for(lambda: downloading in ticket_peers(worker_api, launcher, b, scenario.digest), timeout=30,
             message="b's ticket to list a, downloading")  # fmt: skip
    assert have[0][0] == 0  # one connection, from the first byte
    end = have[0][1]
    got = peer.file(WEIGHTS, cert, f"bytes={end - 1_000_000}-{end - 1}")
    assert got.status_code == 206, got.text
    assert got.content == weights[end - 1_000_000 : end]
    assert status_of(peer.file(WEIGHTS, cert, f"bytes={len(weights) - 10}-")) == (
        416,
        "RequestedRangeNotSatisfiable",
    )
    assert peer.file(WEIGHTS, cert).status_code == 416  # the whole file: not yet
    throttle.release()  # the bodies under way go on at full speed
    hub.faults.clear()
    scenario.wait_state(a.node, "Ready", timeout=90)
    assert peer.tree(cert).json()["state"] == "Ready"
    assert peer.file(WEIGHTS, cert).content == weights
    assert metric(a, "gpustack_models_plugin_peer_served_bytes_total", peer=b.node) == 1_000_000 + len(weights)


@pytest.mark.django_db(transaction=False)
def test_a_ticket_counts_the_nodes_still_joining_beside_the_asking_one(settings):
    """``joining``: the other nodes to start on the digest (a live prefetch targets them, a Pod's volume
    mounts it there, it is placed there) that the ticket cannot list yet (no placement yet, or no Ready
    plugin Pod yet), each once; never one left out, lapsed, reporting the digest Ready or Failed, left out
    by the peers' cap, or the asking node."""
    settings.PLUGIN_PEER_PORT, settings.TICKET_PEERS_MAX, settings.PEER_DOWNLOADING_ALLOWED = PEER_PORT, 16, True
    tag = uuid.uuid4().hex[:8]
    digest, ns = f"sha256:{uuid.uuid4().hex * 2}", f"j-{tag}"
    roles = ("me", "placed", "pending", "held", "mounted", "full", "lapsed", "failed", "unready", "other", "ready")
    me, placed, pending, held, mounted, full, lapsed, failed, unready, other, ready = (f"{tag}-{r}" for r in roles)
    Artifact.objects.create(namespace=ns, name="art", digest=digest, source="huggingFace", resource_version=1)
    Artifact.objects.create(namespace=ns, name="other", digest=f"sha256:{'0' * 64}", resource_version=1)
    warm = Prefetch.objects.create(namespace=ns, name="warm", artifact_name="art", resource_version=1)
    elsewhere = Prefetch.objects.create(namespace=ns, name="else", artifact_name="other", resource_version=1)
    for node, state in [
        (me, TargetState.PENDING),
        (placed, TargetState.HELD),
        (pending, TargetState.PENDING),
        (held, TargetState.HELD),  # the reconcile placed it: its Holding is written below, later
        (full, TargetState.NODE_FULL),
        (failed, TargetState.HELD),
        (ready, TargetState.HELD),
        (unready, TargetState.PENDING),
    ]:
        PrefetchTarget.objects.create(prefetch=warm, node=node, state=state)
    PrefetchTarget.objects.create(prefetch=warm, node=lapsed, state=TargetState.HELD, lapsed_at=timezone.now())
    PrefetchTarget.objects.create(prefetch=elsewhere, node=other, state=TargetState.PENDING)
    MountReference.objects.create(
        node=mounted, volume_id=f"v-{tag}", pod_namespace=ns, pod_name="p", pod_uid=tag, artifact="art",
        digest=digest, last_seen=timezone.now(),
    )  # fmt: skip
    Holding.objects.create(node=placed, digest=digest)
    for node, state in [(failed, EntryState.FAILED), (ready, EntryState.READY)]:
        store = NodeStore.objects.create(name=node, resource_version=1)
        StoreEntry.objects.create(store=store, node=node, digest=digest, state=state)
        Holding.objects.create(node=node, digest=digest)  # placed there, as their targets say
    for i, node in enumerate(roles):
        node = f"{tag}-{node}"
        PluginPod.objects.create(
            namespace="gpustack-system", name=f"plugin-{node}", node=node, pod_ip=f"10.9.0.{i + 1}",
            ready=node not in (unready, failed), resource_version=1,
        )  # fmt: skip

    def listed():
        peers, joining = peer_sources(me, digest)
        return [p["node"] for p in peers], joining

    assert listed() == ([ready, placed], 4)  # pending, held, mounted and unready are to start
    Holding.objects.create(node=held, digest=digest)  # the reconciles go on
    Holding.objects.create(node=pending, digest=digest)
    Holding.objects.create(node=unready, digest=digest)
    peers, joining = listed()
    assert (peers[0], set(peers[1:]), joining) == (ready, {placed, held, pending}, 2)  # mounted; unready's plugin
    Holding.objects.create(node=mounted, digest=digest)
    PluginPod.objects.filter(node=unready).update(ready=True)
    assert listed()[1] == 0  # every node starting beside it is listed
    settings.TICKET_PEERS_MAX = 2
    peers, joining = listed()
    assert (len(peers), peers[0], joining) == (2, ready, 0)  # the cap leaves some out: waiting would not help

    # Nodes that would never be listed are nobody to wait for either.
    Holding.objects.filter(node=mounted).delete()
    PluginPod.objects.filter(node=mounted).update(ready=False)
    assert listed()[1] == 1
    settings.PEER_DOWNLOADING_ALLOWED = False
    assert listed() == ([ready], 0)
