"""Models from S3-compatible storage: objects under a prefix in the suite's real S3 server (versitygw, SigV4
checked) resolve to the digest an independent oracle computes, download on two nodes (the second from its
peer) byte for byte through pre-signed links, keep the versions they were pinned to, fail verification (not
publish) when an unversioned object is rewritten, and every refusal has its reason."""

from __future__ import annotations

import base64
import os
import uuid

import pytest

from gpustack_models.kinds import GROUP
from tests.support.waiting import wait_for
from tests.test_oci_sources import hub_then_peer, oracle_digest
from tests.test_plugins import artifact_path, condition_of

FILES = {
    "config.json": b'{"architectures": ["TinyForCausalLM"]}',
    "model.safetensors": os.urandom(2 * 1024 * 1024 + 5),
    "tokenizer/vocab.txt": "\n".join(f"token{i}" for i in range(2000)).encode(),
}
PREFIX = "models/tiny"


class Bucketed:
    """The scenario's namespace with a bucket of its own, a Secret holding the store's keys."""

    def __init__(self, scenario, s3, core, versioned: bool):
        self.scenario, self.s3, self.kube, self.ns = scenario, s3, scenario.kube, scenario.ns
        self.bucket = s3.create_bucket(f"b-{uuid.uuid4().hex[:10]}", versioned=versioned)
        self.core = core

    def upload(self, files: dict[str, bytes], checksum_of=("config.json", "tokenizer/vocab.txt")) -> None:
        """Some objects with the store's sha256, the others without (the worker computes theirs)."""
        for path, data in files.items():
            self.s3.put(self.bucket, f"{PREFIX}/{path}", data, checksum=path in checksum_of)

    def secret(self, name: str, access_key: str, secret_key: str, keys=("accessKeyId", "secretAccessKey")) -> str:
        data = {k: base64.b64encode(v.encode()).decode() for k, v in zip(keys, (access_key, secret_key), strict=True)}
        self.core.create_namespaced_secret(self.ns, {"metadata": {"name": name}, "data": data})
        return name

    def artifact(self, name: str, bucket: str | None = None, prefix: str = PREFIX, secret: str | None = "keys"):
        source = {"endpoint": self.s3.url, "bucket": bucket or self.bucket, "prefix": prefix, "region": self.s3.region}
        if secret:
            source["secretRef"] = {"name": secret}
        body = {"apiVersion": f"{GROUP}/v1", "kind": "ModelArtifact", "metadata": {"name": name}}
        url = f"{self.scenario.cluster.server}/apis/{GROUP}/v1/namespaces/{self.ns}/modelartifacts"
        created = self.scenario.admin.post(url, json=dict(body, spec={"source": {"s3": source}}))
        assert created.status_code == 201, created.text

    def condition(self, name: str, reason: str) -> dict:
        def check():
            cond = condition_of(self.kube, self.ns, name, "Resolved")
            return cond if cond and cond["reason"] == reason else None

        try:
            return wait_for(check, timeout=60, message=f"{name} to be {reason}")
        except AssertionError as exc:
            raise AssertionError(
                f"{exc}; its conditions: {condition_of(self.kube, self.ns, name, 'Resolved')}"
            ) from None

    def resolved(self, name: str) -> dict:
        self.condition(name, "Resolved")
        return self.kube.get(artifact_path(self.ns, name))["status"]["resolved"]


@pytest.fixture
def bucketed(scenario, s3, core):
    def make(versioned: bool) -> Bucketed:
        made = Bucketed(scenario, s3, core, versioned)
        made.secret("keys", s3.access_key, s3.secret_key)
        return made

    return make


def test_a_prefix_resolves_downloads_from_a_peer_and_keeps_its_versions(bucketed, scenario, kubectl):
    store = bucketed(versioned=True)
    store.upload(FILES)
    store.s3.put(store.bucket, f"{PREFIX}/", b"", checksum=False)  # a folder marker: no file
    store.s3.put(store.bucket, "models/other/x.bin", b"not under the prefix")
    store.artifact("art")
    resolved = store.resolved("art")
    assert resolved["manifestDigest"] == oracle_digest(FILES)
    assert (resolved["fileCount"], resolved["sizeBytes"]) == (3, sum(map(len, FILES.values())))
    assert resolved["revision"].startswith("sha256:")
    scenario.digest = resolved["manifestDigest"]
    # Rewritten after resolution: the nodes fetch the versions the artifact was pinned to.
    store.upload({"model.safetensors": os.urandom(len(FILES["model.safetensors"]))})
    for tree in hub_then_peer(scenario):
        assert {p: tree.get(p) for p in FILES} == FILES
    header, row = kubectl("get", "mart", "art", "-n", store.ns).stdout.splitlines()
    assert header.split()[1] == "SOURCE" and row.split()[1] == f"s3://{store.bucket}/{PREFIX}", (header, row)


def test_an_unversioned_object_rewritten_after_resolution_is_never_published(bucketed, scenario):
    store = bucketed(versioned=False)
    store.upload(FILES)
    store.artifact("art")
    scenario.digest = store.resolved("art")["manifestDigest"]
    weights = bytearray(FILES["model.safetensors"])
    weights[len(weights) // 2] ^= 0xFF  # one byte changed, the size kept
    store.upload({"model.safetensors": bytes(weights)})
    [node] = scenario.plugins(1)
    scenario.prefetch([node])
    scenario.wait_state(node.node, "Failed", reason="IntegrityMismatch")
    assert not scenario.tree(node).exists()


def test_each_refusal_has_its_reason(bucketed):
    store = bucketed(versioned=False)
    store.upload(FILES)
    store.artifact("no-bucket", bucket=f"gone-{uuid.uuid4().hex[:8]}")
    assert "the bucket does not exist" in store.condition("no-bucket", "AccessDenied")["message"]
    store.secret("wrong", store.s3.access_key, "not-the-secret-key")
    store.artifact("wrong", secret="wrong")
    assert "SignatureDoesNotMatch" in store.condition("wrong", "AccessDenied")["message"]
    store.artifact("empty", prefix="models/nothing-here")
    assert "no object under the prefix" in store.condition("empty", "RevisionNotFound")["message"]
    store.core.create_namespaced_secret(store.ns, {"metadata": {"name": "keyless"}, "stringData": {"token": "x"}})
    store.artifact("keyless", secret="keyless")
    assert "has no keys 'accessKeyId'" in store.condition("keyless", "SecretKeyNotFound")["message"]
    # The AWS names of the keys are read too.
    store.secret("aws", store.s3.access_key, store.s3.secret_key, keys=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"))
    store.artifact("aws", secret="aws")
    assert store.resolved("aws")["manifestDigest"] == oracle_digest(FILES)
