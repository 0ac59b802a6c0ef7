"""The CSI driver's pure parts: what a publish request must carry, the messages a Pod's events show while
its model is not Ready, the worker's answers as gRPC codes (against a small local HTTP endpoint), and
socket paths."""

from __future__ import annotations

import http.server
import json
import threading

import grpc
import pytest

from gpustack_models.plugin.csi import validation
from gpustack_models.plugin.csi.generated import csi_pb2
from gpustack_models.plugin.csi.mount_client import WorkerMounts
from gpustack_models.plugin.csi.progress_text import human_bytes, not_ready_message
from gpustack_models.plugin.csi.registration import SocketPathError, check_socket_path
from gpustack_models.plugin.csi.validation import CsiError, Pod
from gpustack_models.plugin.engine.jobs import Entry

Mode = csi_pb2.VolumeCapability.AccessMode
UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"
GiB = 1024**3


def request(**changes):
    context = {
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": "team-a",
        "csi.storage.k8s.io/pod.name": "consumer-0",
        "csi.storage.k8s.io/pod.uid": UID,
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "artifact": "qwen",
    }
    context.update(changes.pop("context", {}))
    context = {k: v for k, v in context.items() if v is not None}
    cap = csi_pb2.VolumeCapability(access_mode=Mode(mode=changes.pop("mode", Mode.SINGLE_NODE_WRITER)))
    cap.mount.SetInParent()
    fields = dict(volume_id="csi-abc", target_path="/var/lib/kubelet/pods/p/volumes/v/mount", readonly=True)
    fields.update(changes)
    return csi_pb2.NodePublishVolumeRequest(volume_capability=cap, volume_context=context, **fields)


def refusal(req, kubelet_dir="/var/lib/kubelet") -> str:
    with pytest.raises(CsiError) as info:
        validation.publish_request(req, kubelet_dir)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.message


def test_it_reads_what_the_kubelet_sends_for_an_inline_volume():
    got = validation.publish_request(request(context={"expectedDigest": "sha256:" + "a" * 64}), "/var/lib/kubelet")
    assert got.pod == Pod("team-a", "consumer-0", UID) and got.artifact == "qwen"
    assert got.expected_digest == "sha256:" + "a" * 64 and got.volume_id == "csi-abc"
    for mode in (Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY):
        assert validation.publish_request(request(mode=mode), None).artifact == "qwen"


@pytest.mark.parametrize(
    "changes, says",
    [
        (dict(volume_id=""), "volume_id is required"),
        (dict(target_path=""), "target_path is required"),
        (dict(readonly=False), "readOnly: true"),
        (dict(mode=Mode.MULTI_NODE_MULTI_WRITER), "MULTI_NODE_MULTI_WRITER"),
        (dict(context={"csi.storage.k8s.io/ephemeral": None}), "inline ephemeral"),
        (dict(context={"csi.storage.k8s.io/pod.uid": None}), "pod.uid"),
        (dict(context={"csi.storage.k8s.io/pod.namespace": "Team_A"}), "namespace"),
        (dict(context={"artifact": None}), "artifact is required"),
        (dict(context={"artifact": "../x"}), "not a ModelArtifact name"),
        (dict(context={"artifactRef": "qwen"}), "unknown volume attributes"),
        (dict(context={"expectedDigest": "sha256:ABC"}), "sha256:<64 hex digits>"),
        (dict(target_path="/var/lib/kubelet/pods/../../../etc"), "normalised"),
        (dict(target_path="/etc/passwd"), "not under the kubelet's pods directory"),
        (dict(target_path="/var/lib/kubelet/podsX/a"), "not under the kubelet's pods directory"),
        (dict(volume_id="v" * 129), "at most 128 bytes"),
        (dict(volume_id="a\tb"), "printable"),
    ],
)
def test_it_refuses_what_is_missing_or_hostile_naming_the_field(changes, says):
    assert says in refusal(request(**changes))


def test_it_requires_a_capability():
    req = request()
    req.ClearField("volume_capability")
    assert "volume_capability is required" in refusal(req)


@pytest.mark.parametrize(
    "entry, says",
    [
        (None, "model qwen is waiting to be downloaded on this node"),
        (Entry("d", "Downloading", 0, 0), "model qwen is waiting to be downloaded on this node"),
        (
            Entry("d", "Downloading", int(7.4 * GiB), int(3.1 * GiB)),
            "model qwen is downloading on this node: 41 % (3.1 GiB of 7.4 GiB)",
        ),
        (
            Entry("d", "Failed", 10, 0, reason="IntegrityMismatch", message="a.bin: bad", retry_time=1_000_030.5),
            "model qwen failed to download on this node (IntegrityMismatch: a.bin: bad); retrying in 31 s (at ",
        ),
        (
            Entry("d", "Failed", 10, 0, reason="SourceUnavailable", retry_time=None),
            "model qwen failed to download on this node (SourceUnavailable); retrying",
        ),
    ],
)
def test_it_tells_a_person_what_the_node_does_with_the_model(entry, says):
    assert not_ready_message("qwen", entry, now=1_000_000.0).startswith(says)


def test_it_writes_sizes_in_binary_units():
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536 * 1024, 7 * GiB)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "1.5 MiB",
        "7.0 GiB",
    ]


def test_it_refuses_socket_paths_a_unix_socket_cannot_bind():
    assert check_socket_path("/" + "s" * 106, "X") == "/" + "s" * 106
    with pytest.raises(SocketPathError, match="108 bytes, a unix socket path has at most 107"):
        check_socket_path("/" + "s" * 107, "GPUSTACK_PLUGIN_CSI_SOCKET")
    with pytest.raises(SocketPathError, match="absolute"):
        check_socket_path("csi.sock", "X")


class Answers(http.server.BaseHTTPRequestHandler):
    """A stand-in for the worker's mount endpoint: answers what the test queued, records the bodies."""

    queue: list = []
    bodies: list = []

    def do_POST(self):
        self.bodies.append(
            (
                self.path,
                self.headers.get("Authorization"),
                json.loads(self.rfile.read(int(self.headers["Content-Length"]))),
            )
        )
        code, body = self.queue.pop(0)
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def worker():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    Answers.queue, Answers.bodies = [], []
    yield WorkerMounts(f"http://127.0.0.1:{server.server_port}", "", "node-a", lambda: {"Authorization": "Bearer t"})
    server.shutdown()


def status(code, message):
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "message": message}


@pytest.mark.parametrize(
    "code, grpc_code",
    [
        (400, grpc.StatusCode.INVALID_ARGUMENT),
        (401, grpc.StatusCode.PERMISSION_DENIED),
        (403, grpc.StatusCode.PERMISSION_DENIED),
        (404, grpc.StatusCode.NOT_FOUND),
        (409, grpc.StatusCode.FAILED_PRECONDITION),
        (500, grpc.StatusCode.UNAVAILABLE),
        (503, grpc.StatusCode.UNAVAILABLE),
    ],
)
def test_it_maps_the_workers_refusals_with_their_message(worker, code, grpc_code):
    Answers.queue.append((code, status(code, f"refused {code}")))
    with pytest.raises(CsiError) as info:
        worker.mount("vol", Pod("ns", "p", UID), "qwen", None)
    assert (info.value.code, info.value.message) == (grpc_code, f"refused {code}")
    path, auth, body = Answers.bodies[0]
    assert path == "/internal/v1/mounts" and auth == "Bearer t"
    assert body == {
        "node": "node-a",
        "volumeId": "vol",
        "pod": {"namespace": "ns", "name": "p", "uid": UID},
        "artifact": "qwen",
        "expectedDigest": None,
    }


def test_it_takes_a_grant_and_refuses_a_malformed_one(worker):
    digest = "sha256:" + "c" * 64
    Answers.queue += [(200, {"digest": digest, "namespace": "ns", "artifact": "qwen", "sizeBytes": 9, "fileCount": 1})]
    assert worker.mount("vol", Pod("ns", "p", UID), "qwen", digest).digest == digest
    Answers.queue += [(200, {"digest": "sha256:../../x"}), (200, b"<html>"), (502, b"bad gateway")]
    for _ in range(3):
        with pytest.raises(CsiError) as info:
            worker.mount("vol", Pod("ns", "p", UID), "qwen", None)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.message


def test_it_says_when_the_worker_is_unreachable():
    unreachable = WorkerMounts("http://127.0.0.1:9", "", "node-a", dict)
    with pytest.raises(CsiError) as info:
        unreachable.release("vol")
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "unreachable" in info.value.message
