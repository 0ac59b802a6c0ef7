"""Models from an OCI registry: a CNCF ModelPack artifact and model images (their layers uncompressed, or gzip
and zstd as buildah pushes them) in the suite's real registry (distribution, behind token auth) resolve to the
digest an independent oracle computes, download on two nodes (the second from its peer) byte for byte, keep
what they resolved to when the tag moves, and every refusal has its reason."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import uuid

import pytest

from gpustack_models.kinds import GROUP
from tests.support import oras
from tests.support.oci_images import LAYER_TAR, push_image, tar_layer
from tests.support.waiting import wait_for
from tests.test_plugins import artifact_path, condition_of

STORAGE = f"/apis/{GROUP}/v1alpha1"

FILES = {
    "config.json": b'{"architectures": ["TinyForCausalLM"], "hidden_size": 64}',
    "model.safetensors": os.urandom(3 * 1024 * 1024 + 17),
    "tokenizer/tokenizer.json": json.dumps({"vocab": {f"t{i}": i for i in range(500)}}).encode(),
}


def oracle_digest(files: dict[str, bytes]) -> str:
    """The manifest digest, computed from the bytes alone: ``gpustack-manifest v1`` and one line per file,
    ``sha256:<hex> <size> <path>``, sorted by path."""
    lines = sorted(f"sha256:{hashlib.sha256(b).hexdigest()} {len(b)} {p}\n" for p, b in files.items())
    text = "gpustack-manifest v1\n" + "".join(sorted(lines, key=lambda line: line.split(" ", 2)[2].encode()))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def pull_secret(core, namespace: str, name: str, registry: str, user: tuple[str, str]) -> str:
    """A ``kubernetes.io/dockerconfigjson`` Secret with ``user``'s credentials for ``registry``."""
    auth = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
    config = {"auths": {registry: {"auth": auth}}}
    data = {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": name}, "type": "kubernetes.io/dockerconfigjson", "data": data}
    )
    return name


def hub_then_peer(scenario) -> list[dict[str, bytes]]:
    """The scenario's digest prefetched to one node (from the source), then to a second (from its peer): each
    node's published tree, ``{path: bytes}``."""
    first, second = scenario.plugins(2)
    scenario.prefetch([first])
    assert scenario.wait_state(first.node, "Ready")["source"] == "Hub"
    scenario.prefetch([second], name="second")
    assert scenario.wait_state(second.node, "Ready")["source"] == "Peer"
    trees = [scenario.tree(plugin) for plugin in (first, second)]
    return [{str(p.relative_to(tree)): p.read_bytes() for p in tree.rglob("*") if p.is_file()} for tree in trees]


class Registered:
    """The scenario's namespace seen from the registry: a repository its user may pull, and a Secret."""

    def __init__(self, scenario, registry, core):
        self.scenario, self.registry, self.kube, self.ns = scenario, registry, scenario.kube, scenario.ns
        self.core = core
        self.repo = f"{self.ns}/model"
        self.writer = registry.add_user(f"{self.ns}-ci", uuid.uuid4().hex, pull=f"{self.ns}/", push=f"{self.ns}/")
        self.reader = registry.add_user(f"{self.ns}-pull", uuid.uuid4().hex, pull=f"{self.ns}/")

    def secret(self, name: str, user: tuple[str, str], registry: str | None = None) -> str:
        return pull_secret(self.core, self.ns, name, registry or self.registry.host, user)

    def artifact(self, name: str, reference: str, secret: str | None = "pull") -> None:
        """Created as a tenant does, through ``worker.gpustack.ai/v1``."""
        source = {"reference": reference, **({"secretRef": {"name": secret}} if secret else {})}
        created = self.post(name, {"oci": source})
        assert created.status_code == 201, created.text

    def post(self, name: str, source: dict):
        body = {"apiVersion": f"{GROUP}/v1", "kind": "ModelArtifact", "metadata": {"name": name}}
        url = f"{self.scenario.cluster.server}/apis/{GROUP}/v1/namespaces/{self.ns}/modelartifacts"
        return self.scenario.admin.post(url, json=dict(body, spec={"source": source}))

    def resolved(self, name: str, reason: str = "Resolved") -> dict:
        def check():
            cond = condition_of(self.kube, self.ns, name, "Resolved")
            return cond if cond and cond["reason"] == reason else None

        self.wait(check, f"{name} to be {reason}", name)
        return self.kube.get(artifact_path(self.ns, name))

    def wait(self, check, message: str, name: str):
        """``wait_for``, failing with what the artifact's conditions say at the end."""
        try:
            return wait_for(check, timeout=60, message=message)
        except AssertionError as exc:
            conditions = (self.kube.get(artifact_path(self.ns, name)).get("status") or {}).get("conditions")
            raise AssertionError(f"{exc}; its conditions: {conditions}") from None

    def downloads_on_two_nodes(self, reference: str, expected: dict[str, bytes]) -> None:
        """``reference`` as the artifact ``art``: it resolves to the oracle's digest of ``expected``, and both
        nodes' trees (the first from the registry, the second from its peer) are ``expected``, byte for byte."""
        self.artifact("art", reference)
        resolved = self.resolved("art")["status"]["resolved"]
        assert resolved["manifestDigest"] == oracle_digest(expected)
        self.scenario.digest = resolved["manifestDigest"]
        for tree in hub_then_peer(self.scenario):
            assert tree == expected

    def refused(self, name: str, reason: str) -> str:
        """The message of the ``Resolved`` condition, once its reason is ``reason``."""

        def check():
            cond = condition_of(self.kube, self.ns, name, "Resolved")
            return cond["message"] if cond and cond["reason"] == reason else None

        return self.wait(check, f"{name} to be refused with {reason}", name)


@pytest.fixture
def oci(scenario, registry, core):
    registered = Registered(scenario, registry, core)
    registered.secret("pull", registered.reader)
    return registered


def test_a_modelpack_artifact_resolves_downloads_from_a_peer_and_ignores_a_moved_tag(oci, scenario, kubectl, tmp_path):
    """Pushed by oras, as a team pushes a model (a layer per file, titled by its path)."""
    reference = f"{oci.registry.host}/{oci.repo}:v1"
    pushed = oras.push_model(reference, FILES, oci.writer, tmp_path / "push")
    assert oci.registry.get_manifest(oci.repo, "v1", oci.reader)[2] == pushed
    oci.artifact("art", reference)
    resolved = oci.resolved("art")["status"]["resolved"]
    assert resolved["manifestDigest"] == oracle_digest(FILES)
    assert resolved["revision"] == pushed  # the tag, pinned to the manifest digest it named
    assert (resolved["fileCount"], resolved["sizeBytes"]) == (3, sum(map(len, FILES.values())))
    scenario.digest = resolved["manifestDigest"]
    # The tag moves after resolution: the nodes still fetch what the artifact resolved to.
    oci.registry.push_modelpack(oci.repo, "v1", {"model.safetensors": b"other weights"}, oci.writer)
    for tree in hub_then_peer(scenario):
        assert {p: tree[p] for p in FILES} == FILES
        assert sorted(tree) == sorted(FILES)
    # kubectl's SOURCE column names the reference.
    header, row = kubectl("get", "mart", "art", "-n", oci.ns).stdout.splitlines()
    assert header.split()[:3] == ["NAME", "SOURCE", "REVISION"], header
    assert row.split()[1] == f"oci:{oci.registry.host}/{oci.repo}:v1", row


def test_a_hostile_or_ambiguous_source_is_refused_at_creation(oci):
    for reference in ("Registry.example/Upper/x:v1", "r.example/a/../b:v1", "r.example/x:v1@sha256:123", ""):
        refused = oci.post("bad", {"oci": {"reference": reference}})
        assert refused.status_code == 422, (reference, refused.text)
        assert "spec.source.oci.reference" in refused.text, refused.text
    both = oci.post("both", {"oci": {"reference": "r.example/x:v1"}, "huggingFace": {"repository": "org/x"}})
    assert both.status_code == 422 and "exactly one of huggingFace, modelScope, oci" in both.text, both.text


def test_a_digest_pinned_reference_and_each_refusal_reason(oci):
    pushed = oci.registry.push_modelpack(oci.repo, "v2", FILES, oci.writer)
    host = oci.registry.host
    oci.artifact("pinned", f"{host}/{oci.repo}@{pushed}")
    assert oci.resolved("pinned")["status"]["resolved"]["manifestDigest"] == oracle_digest(FILES)
    # A wrong password: refused by the registry's token service.
    oci.secret("wrong", (oci.reader[0], "not-the-password"))
    oci.artifact("wrong", f"{host}/{oci.repo}:v2", secret="wrong")
    assert "token service refused the Secret's credentials" in oci.refused("wrong", "AccessDenied")
    # No credential at all: the anonymous token grants nothing.
    oci.artifact("anonymous", f"{host}/{oci.repo}:v2", secret=None)
    assert "no credentials (no secretRef)" in oci.refused("anonymous", "AccessDenied")
    # A tag the repository does not have.
    oci.artifact("missing", f"{host}/{oci.repo}:no-such-tag")
    assert "no such tag" in oci.refused("missing", "RevisionNotFound")
    # A Secret with credentials for another registry only.
    oci.secret("elsewhere", oci.reader, registry="registry.example.com")
    oci.artifact("elsewhere", f"{host}/{oci.repo}:v2", secret="elsewhere")
    assert f"no auths entry for the registry {host}" in oci.refused("elsewhere", "SecretKeyNotFound")


def test_a_cluster_that_requires_pinning_refuses_a_tag(oci, worker_stack):
    pushed = oci.registry.push_modelpack(oci.repo, "v3", FILES, oci.writer)
    worker_stack.extra_env["GPUSTACK_OCI_REQUIRE_DIGEST"] = "true"
    worker_stack.stop("celery")
    worker_stack.start("celery")
    try:
        oci.artifact("tagged", f"{oci.registry.host}/{oci.repo}:v3")
        assert "requires references pinned by digest" in oci.refused("tagged", "ReferenceNotPinned")
        oci.artifact("pinned", f"{oci.registry.host}/{oci.repo}@{pushed}")
        oci.resolved("pinned")
    finally:
        del worker_stack.extra_env["GPUSTACK_OCI_REQUIRE_DIGEST"]
        worker_stack.stop("celery")
        worker_stack.start("celery")


def buildah_image(oci, files: dict[str, bytes], tag: str, tmp_path, compression: str = "gzip") -> str:
    """A modelcar image built and pushed by buildah: the files under /models of an otherwise empty image, its
    layer compressed as buildah compresses what it pushes (``compression``: gzip, its default, or zstd).
    Returns the reference."""
    from tests.support.image_build import Buildah

    buildah = Buildah()
    for path, data in files.items():
        (tmp_path / "models" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "models" / path).write_bytes(data)
    reference = f"{oci.registry.host}/{oci.repo}-{compression}:{tag}"
    image = f"localhost/modelcar-{uuid.uuid4().hex[:8]}"
    with buildah.locked(exclusive=False):
        container = buildah("from", "scratch").stdout.strip()
        try:
            buildah("copy", container, str(tmp_path / "models"), "/models")
            buildah("commit", "--format", "oci", container, image)
        finally:
            buildah("rm", container, check=False)
        try:
            creds = f"{oci.writer[0]}:{oci.writer[1]}"
            flags = ["--compression-format", compression, "--tls-verify=false", "--creds", creds]
            buildah("push", *flags, image, f"docker://{reference}")
        finally:
            buildah("rmi", image, check=False)
    return reference


def test_a_model_image_flattens_its_layers_and_downloads_from_a_peer(oci):
    """A modelcar image: the files under /models of its layers applied in order (a later layer replaces one file
    and deletes another), each fetched by range from inside its layer."""
    first_layer = {f"models/{p}": data for p, data in FILES.items()} | {"models/stale.bin": b"gone", "bin/x": b"x"}
    second_layer = {"models/config.json": b'{"replaced": true}', "models/stale.bin": None}
    layers = [tar_layer(first_layer), tar_layer(second_layer)]  # uncompressed: each file fetched by range
    reference = push_image(oci.registry, f"{oci.repo}-image", oci.writer, "v1", layers)
    expected = FILES | {"config.json": b'{"replaced": true}'}
    oci.downloads_on_two_nodes(reference, expected)


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_model_image_pushed_by_buildah_downloads_from_its_compressed_layer_then_from_a_peer(
    oci, tmp_path, compression
):
    """What image builders push: every layer compressed. Each node reads the layer once from its start, or
    fetches the files from a peer that holds them."""
    reference = buildah_image(oci, FILES, "v1", tmp_path, compression)
    manifest = json.loads(oci.registry.get_manifest(f"{oci.repo}-{compression}", "v1", oci.reader)[0])
    assert [layer["mediaType"] for layer in manifest["layers"]] == [f"{LAYER_TAR}+{compression}"]
    oci.downloads_on_two_nodes(reference, FILES)
