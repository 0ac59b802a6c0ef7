"""The API's answers to the CSI driver's mount calls, as gRPC codes (against a small local HTTP endpoint)."""

from __future__ import annotations

import http.server
import json
import threading

import grpc
import pytest

from gpustack_models.plugin.csi.mount_client import MountClient
from gpustack_models.plugin.csi.validation import CsiError, Pod

UID = "0b3f6f0e-7a51-4e6f-9d1e-6a1c5e0f0c11"


class Answers(http.server.BaseHTTPRequestHandler):
    """A stand-in for the API's mount endpoint: answers what the test queued, records the bodies."""

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
def api():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    Answers.queue, Answers.bodies = [], []
    yield MountClient(f"http://127.0.0.1:{server.server_port}", "", "node-a", lambda: {"Authorization": "Bearer t"})
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
def test_it_maps_the_apis_refusals_with_their_message(api, code, grpc_code):
    Answers.queue.append((code, status(code, f"refused {code}")))
    with pytest.raises(CsiError) as info:
        api.mount("vol", Pod("ns", "p", UID), "qwen", None)
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


def test_it_takes_a_grant_and_refuses_a_malformed_one(api):
    digest = "sha256:" + "c" * 64
    Answers.queue += [(200, {"digest": digest, "namespace": "ns", "artifact": "qwen", "sizeBytes": 9, "fileCount": 1})]
    assert api.mount("vol", Pod("ns", "p", UID), "qwen", digest).digest == digest
    Answers.queue += [(200, {"digest": "sha256:../../x"}), (200, b"<html>"), (502, b"bad gateway")]
    for _ in range(3):
        with pytest.raises(CsiError) as info:
            api.mount("vol", Pod("ns", "p", UID), "qwen", None)
        assert info.value.code == grpc.StatusCode.UNAVAILABLE and info.value.message


def test_it_says_when_the_api_is_unreachable():
    unreachable = MountClient("http://127.0.0.1:9", "", "node-a", dict)
    with pytest.raises(CsiError) as info:
        unreachable.release("vol")
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and "unreachable" in info.value.message
