"""The v1alpha1 storage CRDs: generated from the definitions, installed, and validating in kube-apiserver."""

import copy
import uuid

import pytest

from gpustack_models import install
from gpustack_models.kinds import GROUP, KINDS, STORAGE_VERSION
from gpustack_models.kinds import crd as crd_module
from tests.support import read_modify_write

DIGEST = "sha256:" + "ab" * 32


def artifact(name=None, **spec):
    body = {
        "apiVersion": f"{GROUP}/{STORAGE_VERSION}",
        "kind": "ModelArtifact",
        "metadata": {"name": name or f"a-{uuid.uuid4().hex[:8]}"},
        "spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen2.5-0.5B"}}},
    }
    body["spec"].update(spec)
    return body


def url(cluster, namespace, plural="modelartifacts", name=""):
    base = f"{cluster.server}/apis/{GROUP}/{STORAGE_VERSION}/namespaces/{namespace}/{plural}"
    return f"{base}/{name}" if name else base


def assert_invalid(resp, field):
    assert resp.status_code == 422, resp.text
    status = resp.json()
    assert status["kind"] == "Status" and status["reason"] == "Invalid"
    fields = [c.get("field") for c in status["details"]["causes"]]
    assert field in fields, (field, status["details"]["causes"])
    return status


def test_it_keeps_deploy_in_step_with_the_definitions():
    assert install.stale_files() == [], "run `python manage.py writemanifests`"


def test_it_notices_a_stale_crd_file(tmp_path, monkeypatch):
    monkeypatch.setattr(crd_module, "CRD_DIR", tmp_path / "crds")
    monkeypatch.setattr(install, "DEPLOY_DIR", tmp_path)
    for path, text in install.deploy_files().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert install.stale_files() == []
    victim = next(iter(crd_module.crd_files()))
    victim.write_text(victim.read_text().replace("maxItems: 32", "maxItems: 33"))
    assert install.stale_files() == [victim]
    victim.unlink()
    assert install.stale_files() == [victim]


def test_it_installs_storage_crds_without_short_names_or_categories(admin_http, cluster):
    for kind in KINDS:
        resp = admin_http.get(
            f"{cluster.server}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{kind.plural}.{GROUP}"
        )
        assert resp.status_code == 200
        crd = resp.json()
        names = crd["spec"]["names"]
        assert "shortNames" not in names and "categories" not in names
        assert [v["name"] for v in crd["spec"]["versions"]] == [STORAGE_VERSION]
        assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
        conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
        assert conditions["Established"] == "True"
        # The schema carries the definitions' field documentation.
        spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        assert spec["description"] == kind.spec.description


def test_it_gives_the_v1_short_names_to_no_storage_resource(admin_http, cluster):
    discovery = admin_http.get(f"{cluster.server}/apis/{GROUP}/{STORAGE_VERSION}").json()
    resources = {r["name"]: r for r in discovery["resources"]}
    assert set(resources) >= {k.plural for k in KINDS}
    for kind in KINDS:
        assert "shortNames" not in resources[kind.plural]
        assert "categories" not in resources[kind.plural]


def test_it_accepts_a_valid_artifact_and_applies_defaults(storage_http, cluster, namespace):
    resp = storage_http.post(
        url(cluster, namespace), json=artifact("good", allowPatterns=["*.json"], expectedDigest=DIGEST)
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["spec"]["source"]["huggingFace"]["revision"] == "main"
    claim = artifact("claim")
    claim["spec"]["source"] = {"persistentVolumeClaim": {"claimName": "models", "path": "qwen/7b"}}
    assert storage_http.post(url(cluster, namespace), json=claim).status_code == 201


def test_it_refuses_two_source_members(storage_http, cluster, namespace):
    body = artifact()
    body["spec"]["source"]["modelScope"] = {"repository": "qwen/Qwen2.5-0.5B"}
    status = assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.source")
    assert "exactly one" in status["message"]


def test_it_refuses_no_source_member(storage_http, cluster, namespace):
    body = artifact()
    body["spec"]["source"] = {}
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.source")


def test_it_refuses_33_allow_patterns(storage_http, cluster, namespace):
    body = artifact(allowPatterns=[f"*.{i}" for i in range(33)])
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.allowPatterns")


@pytest.mark.parametrize("pattern", ["", "x" * 257])
def test_it_refuses_patterns_outside_1_to_256_characters(storage_http, cluster, namespace, pattern):
    body = artifact(ignorePatterns=[pattern])
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.ignorePatterns[0]")


def test_it_refuses_patterns_on_a_claim_source(storage_http, cluster, namespace):
    body = artifact(allowPatterns=["*.json"])
    body["spec"]["source"] = {"persistentVolumeClaim": {"claimName": "models"}}
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.allowPatterns")


@pytest.mark.parametrize("digest", ["sha256:abc", "sha256:" + "AB" * 32, "md5:" + "ab" * 32])
def test_it_refuses_a_malformed_expected_digest(storage_http, cluster, namespace, digest):
    body = artifact(expectedDigest=digest)
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.expectedDigest")


@pytest.mark.parametrize("path", ["../etc", "a/../b", "a//b", "./a"])
def test_it_refuses_a_claim_path_that_escapes(storage_http, cluster, namespace, path):
    body = artifact()
    body["spec"]["source"] = {"persistentVolumeClaim": {"claimName": "models", "path": path}}
    assert_invalid(storage_http.post(url(cluster, namespace), json=body), "spec.source.persistentVolumeClaim.path")


def test_it_refuses_any_change_of_spec_after_creation(storage_http, cluster, namespace):
    storage_http.post(url(cluster, namespace), json=artifact("frozen"))

    def change(obj):
        obj["spec"]["source"]["huggingFace"]["revision"] = "v2"
        return obj

    assert_invalid(read_modify_write(storage_http, url(cluster, namespace, name="frozen"), change), "spec")
    patched = storage_http.patch(
        url(cluster, namespace, name="frozen"),
        json={"spec": {"allowPatterns": ["*.json"]}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert_invalid(patched, "spec")
    # Metadata stays mutable.
    labelled = storage_http.patch(
        url(cluster, namespace, name="frozen"),
        json={"metadata": {"labels": {"team": "a"}}},
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert labelled.status_code == 200


def test_it_ignores_status_in_an_update_of_the_main_resource(storage_http, cluster, namespace):
    storage_http.post(url(cluster, namespace), json=artifact("st"))
    status = {"resolved": {"revision": "f" * 40, "manifestDigest": DIGEST, "fileCount": 1, "sizeBytes": 1}}
    via_status = read_modify_write(
        storage_http, url(cluster, namespace, name="st") + "/status", lambda obj: dict(obj, status=status)
    )
    assert via_status.status_code == 200

    def forge(obj):
        forged = dict(obj, status={"resolved": dict(status["resolved"], manifestDigest="sha256:" + "00" * 32)})
        forged["metadata"] = dict(obj["metadata"], labels={"x": "y"})
        return forged

    updated = read_modify_write(storage_http, url(cluster, namespace, name="st"), forge)
    assert updated.status_code == 200
    assert updated.json()["metadata"]["labels"] == {"x": "y"}
    again = storage_http.get(url(cluster, namespace, name="st")).json()
    assert again["status"]["resolved"]["manifestDigest"] == DIGEST


def test_it_validates_node_model_stores_and_prefetches(storage_http, cluster, namespace):
    store = {
        "apiVersion": f"{GROUP}/{STORAGE_VERSION}",
        "kind": "NodeModelStore",
        "metadata": {"name": f"node-{uuid.uuid4().hex[:6]}"},
        "spec": {"models": [{"digest": DIGEST}]},
    }
    stores = f"{cluster.server}/apis/{GROUP}/{STORAGE_VERSION}/nodemodelstores"
    created = storage_http.post(stores, json=store)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["models"] == [{"digest": DIGEST, "pinned": False}]
    storage_http.delete(f"{stores}/{store['metadata']['name']}")
    bad = dict(store, metadata={"name": "bad-store"}, spec={"watermarks": {"highPercent": 50, "lowPercent": 60}})
    assert_invalid(storage_http.post(stores, json=bad), "spec.watermarks")

    prefetch = {
        "apiVersion": f"{GROUP}/{STORAGE_VERSION}",
        "kind": "ModelPrefetch",
        "metadata": {"name": "warm"},
        "spec": {"artifactRef": {"name": "a"}, "nodeNames": ["n1", "n2"]},
    }
    ok = storage_http.post(url(cluster, namespace, "modelprefetches"), json=prefetch)
    assert ok.status_code == 201, ok.text
    assert ok.json()["spec"]["minReady"] == 0
    both = copy.deepcopy(prefetch)
    both["metadata"]["name"] = "both"
    both["spec"]["nodeSelector"] = {"matchLabels": {"gpu": "a100"}}
    assert_invalid(storage_http.post(url(cluster, namespace, "modelprefetches"), json=both), "spec")
