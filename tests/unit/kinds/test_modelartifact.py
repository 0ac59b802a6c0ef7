"""ModelArtifact as its one definition declares it: the spec's validation (one source, hub-only fields,
immutability, pattern and repository bounds, revisions' defaults), its raw fields and v1 columns, and the
progress subresource's Table. Enforced by kube-apiserver: tests/test_crds.py."""

import re

import pytest

from gpustack_models.kinds import MODEL_ARTIFACT, PROGRESS_COLUMNS
from gpustack_models.kinds.modelartifact import PATTERNS_LIMIT, REPOSITORY_PATTERN

NODES = dict(MODEL_ARTIFACT.object_schema().walk())


def at(path: str) -> dict:
    return NODES[path].to_openapi()


def rules(path: str) -> dict[str, dict]:
    return {r["message"]: r for r in at(path).get("x-kubernetes-validations", [])}


def test_it_is_a_namespaced_kind_with_its_short_name_and_progress():
    kind = MODEL_ARTIFACT
    assert (kind.kind, kind.plural, kind.singular, kind.scope) == (
        "ModelArtifact",
        "modelartifacts",
        "modelartifact",
        "Namespaced",
    )
    assert kind.short_names == ("mart",) and kind.subresources == (
        ("progress", "ModelArtifactProgress", ("get",)),
        ("files", "ModelArtifactFiles", ("get",)),
    )
    assert set(kind.verbs) == {"create", "delete", "get", "list", "patch", "update", "watch"}
    assert at("")["required"] == ["spec"] and at("spec")["required"] == ["source"]


def test_exactly_one_source_and_a_spec_that_never_changes():
    assert "self == oldSelf" in {r["rule"] for r in rules("spec").values()}
    one = rules("spec.source")["exactly one of huggingFace, modelScope, oci, s3 or persistentVolumeClaim must be set"]
    assert one["rule"].endswith(".filter(x, x).size() == 1")
    members = {"huggingFace", "modelScope", "oci", "s3", "persistentVolumeClaim"}
    assert set(at("spec.source")["properties"]) == members
    assert all(f"has(self.{member})" in one["rule"] for member in members)


@pytest.mark.parametrize("field", ["allowPatterns", "ignorePatterns", "expectedDigest"])
def test_patterns_and_the_expected_digest_are_refused_on_a_claim(field):
    [rule] = [r for r in rules("spec").values() if r.get("fieldPath") == f".{field}"]
    assert rule["rule"] == f"!has(self.source.persistentVolumeClaim) || !has(self.{field})"
    assert rule["reason"] == "FieldValueForbidden" and "hub sources only" in rule["message"]


def test_patterns_are_at_most_32_of_1_to_256_characters():
    assert PATTERNS_LIMIT == 32
    for field in ("allowPatterns", "ignorePatterns"):
        patterns = at(f"spec.{field}")
        assert (patterns["maxItems"], patterns["x-kubernetes-list-type"]) == (32, "atomic")
        assert (patterns["items"]["minLength"], patterns["items"]["maxLength"]) == (1, 256)


# ModelScope's repositories are on master or main: no schema default, the resolver takes the repository's.
@pytest.mark.parametrize("hub, default", [("huggingFace", "main"), ("modelScope", None)])
def test_each_hub_takes_a_repository_a_revision_with_its_default_and_a_secret(hub, default):
    source = at(f"spec.source.{hub}")
    assert source["required"] == ["repository"] and set(source["properties"]) == {"repository", "revision", "secretRef"}
    assert source["properties"]["revision"].get("default") == default
    assert source["properties"]["repository"]["pattern"] == REPOSITORY_PATTERN
    assert at(f"spec.source.{hub}.secretRef")["required"] == ["name"]


@pytest.mark.parametrize(
    "repository, ok",
    [("Qwen/Qwen2.5-7B-Instruct", True), ("gpt2", True), ("org/a.b_c-d", True), ("../x", False),
     ("org/model/extra", False), ("/model", False), ("org/", False), ("org/mo del", False)],
)  # fmt: skip
def test_a_repository_is_a_name_or_owner_slash_name(repository, ok):
    assert bool(re.search(REPOSITORY_PATTERN, repository)) is ok


@pytest.mark.parametrize("path, ok", [("qwen/7b", True), ("a", True), ("/abs", False), ("dir/", False)])
def test_a_claim_path_is_relative(path, ok):
    claim = at("spec.source.persistentVolumeClaim.path")
    assert bool(re.search(claim["pattern"], path)) is ok
    assert "s == '..'" in claim["x-kubernetes-validations"][0]["rule"]  # '..' segments: the CEL rule's
    assert at("spec.source.persistentVolumeClaim")["required"] == ["claimName"]


def test_the_status_holds_the_resolved_content_and_the_nodes_rolled_up():
    assert set(at("status.resolved")["properties"]) == {"revision", "manifestDigest", "fileCount", "sizeBytes"}
    nodes = at("status.nodes")["properties"]
    assert set(nodes) == {"ready", "downloading", "failed", "downloadingPercent"}
    assert (nodes["downloadingPercent"]["minimum"], nodes["downloadingPercent"]["maximum"]) == (0, 100)


def test_the_storage_crd_prints_the_raw_fields_the_v1_columns_need():
    assert [(f.name, f.json_path, f.type, f.priority) for f in MODEL_ARTIFACT.fields] == [
        ("HF Repository", ".spec.source.huggingFace.repository", "string", 1),
        ("MS Repository", ".spec.source.modelScope.repository", "string", 1),
        ("OCI Reference", ".spec.source.oci.reference", "string", 1),
        ("S3 Bucket", ".spec.source.s3.bucket", "string", 1),
        ("S3 Prefix", ".spec.source.s3.prefix", "string", 1),
        ("Claim", ".spec.source.persistentVolumeClaim.claimName", "string", 1),
        ("Claim Path", ".spec.source.persistentVolumeClaim.path", "string", 1),
        ("HF Revision", ".spec.source.huggingFace.revision", "string", 1),
        ("MS Revision", ".spec.source.modelScope.revision", "string", 1),
        ("Revision", ".status.resolved.revision", "string", 0),
        ("Size", ".status.resolved.sizeBytes", "integer", 0),
        ("Ready", ".status.nodes.ready", "integer", 0),
        ("Downloading", ".status.nodes.downloading", "integer", 0),
        ("Resolved", '.status.conditions[?(@.type=="Resolved")].status', "string", 0),
        ("Resolved Reason", '.status.conditions[?(@.type=="Resolved")].reason', "string", 1),
        ("Age", ".metadata.creationTimestamp", "date", 1),
    ]
    assert MODEL_ARTIFACT.table_from_fields  # a list is rendered from kube-apiserver's raw cells


def test_the_v1_columns_render_from_the_raw_cells():
    cells = {
        "HF Repository": "Qwen/Qwen2.5",
        "HF Revision": "v2.5",
        "Revision": "0123456789abcdef0123456789abcdef01234567",
        "Size": 999604126,
        "Ready": 2,
        "Downloading": None,
        "Resolved": "True",
        "Age": "3d",
    }
    row = {c.name: c.render(cells) for c in MODEL_ARTIFACT.columns}
    assert row == {
        "Source": "hf:Qwen/Qwen2.5",
        "Revision": "v2.5",
        "Commit": "0123456789ab",
        "Size": "953.3Mi",
        "Ready": 2,
        "Downloading": 0,
        "Resolved": "True",
        "Age": "3d",
    }


def test_the_progress_table_renders_from_the_progress_answer():
    progress = {
        "ready": 1,
        "downloading": 2,
        "failed": 1,
        "downloadingPercent": 41,
        "downloadingBytes": 3 * 1024**3,
        "sizeBytes": 4 * 1024**3,
        "live": 2,
        "manifestDigest": "sha256:" + "ab" * 32,
        "failureReasons": [{"reason": "AccessDenied", "count": 1}, {"reason": "SourceUnavailable", "count": 2}],
    }
    row = {c.name: c.object_render(progress) for c in PROGRESS_COLUMNS}
    assert row == {
        "Ready": 1,
        "Downloading": 2,
        "Failed": 1,
        "Percent": "41%",
        "Rate": "",
        "ETA": "",
        "Bytes": "3.0Gi/8.0Gi",  # of the content's size on each downloading node
        "Live": 2,
        "Digest": "sha256:abababababab",
        "Failures": "AccessDenied:1,SourceUnavailable:2",
        "Reason": "",
    }
    idle = {c.name: c.object_render({"reason": "ClaimSource"}) for c in PROGRESS_COLUMNS}
    assert (idle["Percent"], idle["Bytes"], idle["Failures"], idle["Reason"]) == ("", "", "", "ClaimSource")
