"""``kubectl get mart NAME --subresource=progress``: the progress subresource as kubectl prints it."""

import json
import subprocess

import pytest
import yaml
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from gpustack_models.kinds.formatting import human_bytes
from tests.support import wait_for
from tests.support.stores import STORAGE, entry, place, put_entries, store

HEADER = ["NAME", "READY", "DOWNLOADING", "FAILED", "PERCENT", "BYTES", "RATE", "ETA", "LIVE"]
WIDE = HEADER + ["DIGEST", "FAILURES", "REASON"]


@pytest.fixture
def api(worker_api, kubectl):
    return kubectl


def progress(api, name, namespace, *extra, **kwargs):
    return api("get", "mart", name, "-n", namespace, "--subresource=progress", *extra, **kwargs)


def rows(out) -> list[list[str]]:
    return [line.split() for line in out.stdout.splitlines()]


def test_it_prints_the_progress_of_an_artifact_as_a_table(api, nodes, resolved, worker_kube, namespace, launcher):
    artifact, digest = resolved
    launcher.plugin_pki(nodes[1], "127.0.0.1")  # the plugins' CA, which the API trusts for its live reads
    size = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{artifact}")["status"]["resolved"]
    size = size["sizeBytes"]
    ready, downloading, failed = nodes
    for name in nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    place(worker_kube, namespace, artifact, digest, nodes)  # entries count where the digest was placed
    put_entries(worker_kube, ready, [entry(digest, "Ready", size, size)])
    put_entries(worker_kube, downloading, [entry(digest, "Downloading", size // 2, size)])
    put_entries(worker_kube, failed, [entry(digest, "Failed", size=size, reason="SourceUnavailable")])
    expected = [artifact, "1", "1", "1", "50%", f"{human_bytes(size // 2)}/{human_bytes(size)}", "0"]
    table = wait_for(
        lambda: (got := rows(progress(api, artifact, namespace))) and got[1:] == [expected] and got,
        timeout=30,
        message="the entries in the progress table",
    )
    assert table[0] == HEADER
    wide = rows(progress(api, artifact, namespace, "-o", "wide"))
    assert wide == [WIDE, expected + [digest[:19], "SourceUnavailable:1"]]  # no reason: the last cell is empty
    # kubectl asks the subresource itself for a Table; other outputs get the object.
    verbose = progress(api, artifact, namespace, "-v=8")
    assert f"/modelartifacts/{artifact}/progress" in verbose.stderr
    assert "application/json;as=Table;v=v1;g=meta.k8s.io" in verbose.stderr
    answer = json.loads(progress(api, artifact, namespace, "-o", "json").stdout)
    assert answer["kind"] == "ModelArtifactProgress" and answer["downloadingPercent"] == 50


def test_it_lists_the_files_of_the_resolved_content_and_refuses_a_tenant_without_the_right(
    api, resolved, namespace, api_client, cluster
):
    """``kubectl get mart NAME --subresource=files``: the manifest every node verifies, outside the console."""
    import hashlib

    artifact, digest = resolved
    weights = b"w" * 4096  # the fixture's files (tests.support.stores.resolved)
    table = rows(api("get", "mart", artifact, "-n", namespace, "--subresource=files"))
    assert table[0] == ["PATH", "SIZE"]
    assert [r[0] for r in table[1:]] == ["config.json", "model.safetensors"]
    assert (table[1][1], table[2][1]) == ("12B", "4.0Ki")  # config.json holds "org/w-" and 6 hex characters
    wide = {r[0]: r for r in rows(api("get", "mart", artifact, "-n", namespace, "--subresource=files", "-o", "wide"))}
    blob = hashlib.sha1(b"blob 4096\0" + weights).hexdigest()
    assert wide["model.safetensors"][2] in (f"sha256:{hashlib.sha256(weights).hexdigest()}", f"gitsha1:{blob}")
    answer = json.loads(api("get", "mart", artifact, "-n", namespace, "--subresource=files", "-o", "json").stdout)
    assert (answer["kind"], answer["manifestDigest"], len(answer["files"])) == ("ModelArtifactFiles", digest, 2)
    # Reading files is its own right, as progress is: get on the artifact alone is not enough.
    rules = [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"], verbs=["get"])]
    _bind(api_client, namespace, "dave", rules, name="files-getter")
    token = cluster.tokens()["dave"]
    wait_for(lambda: api("get", "mart", artifact, "-n", namespace, token=token, check=False).returncode == 0,
             timeout=15, message="dave to get the artifact")  # fmt: skip
    refused = api("get", "mart", artifact, "-n", namespace, "--subresource=files", token=token, check=False)
    assert refused.returncode != 0 and "modelartifacts/files" in refused.stderr, refused.stderr


def test_it_prints_an_artifact_on_a_claim_as_a_row_with_its_reason(api, namespace):
    claim = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": "on-claim", "namespace": namespace},
        "spec": {"source": {"persistentVolumeClaim": {"claimName": "models"}}},
    }
    api("apply", "-f", "-", input=yaml.safe_dump(claim))
    # Percent, Bytes, Digest and Failures are empty.
    assert rows(progress(api, "on-claim", namespace, "-o", "wide")) == [
        WIDE,
        ["on-claim", "0", "0", "0", "0", "ClaimSource"],
    ]


def test_it_tells_a_missing_artifact_and_a_tenant_without_progress_rights(api, namespace, api_client, cluster):
    missing = progress(api, "nowhere", namespace, check=False)
    assert missing.returncode != 0 and "(NotFound)" in missing.stderr, missing.stderr
    api("apply", "-f", "-", input=yaml.safe_dump(_artifact("guarded", namespace)))
    rules = [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"], verbs=["get"])]
    _bind(api_client, namespace, "carol", rules)
    token = cluster.tokens()["carol"]
    wait_for(
        lambda: api("get", "mart", "guarded", "-n", namespace, token=token, check=False).returncode == 0,
        timeout=15,
        message="carol to get the artifact",
    )
    refused = progress(api, "guarded", namespace, token=token, check=False)
    assert refused.returncode != 0
    assert "(Forbidden)" in refused.stderr and "modelartifacts/progress" in refused.stderr, refused.stderr


def test_it_leaves_a_watch_to_the_artifact_as_kubectl_does(api, namespace, cluster, tmp_path):
    """kubectl drops ``--subresource`` from ``-w``: it gets and watches the artifact itself, never
    ``progress`` (whose watch is refused)."""
    api("apply", "-f", "-", input=yaml.safe_dump(_artifact("watched", namespace)))
    cmd = [
        str(cluster.kubectl),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--cache-dir={tmp_path}/wc",
        *("get", "mart", "watched", "-n", namespace, "--subresource=progress", "-w", "-v=6"),
        "--request-timeout=5s",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[0].split()[:2] == ["NAME", "SOURCE"], (done.stdout, done.stderr)
    assert "/progress" not in done.stderr
    assert "modelartifacts?fieldSelector=metadata.name%3Dwatched" in done.stderr and "watch=true" in done.stderr


def _artifact(name, namespace):
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ModelArtifact",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"source": {"huggingFace": {"repository": "Qwen/Qwen2.5-0.5B"}}},
    }


def _bind(api_client, namespace, user, rules, name="artifact-getter"):
    rbac = k8s.RbacAuthorizationV1Api(api_client)
    rbac.create_namespaced_role(namespace, k8s.V1Role(metadata=k8s.V1ObjectMeta(name=name), rules=rules))
    rbac.create_namespaced_role_binding(
        namespace,
        k8s.V1RoleBinding(
            metadata=k8s.V1ObjectMeta(name=name),
            role_ref=k8s.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name=name),
            subjects=[k8s.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")],
        ),
    )
