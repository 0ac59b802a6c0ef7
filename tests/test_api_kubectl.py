"""The public API as users meet it: kubectl through kube-apiserver's aggregation layer."""

import json
import subprocess
import threading
import uuid

import pytest
import yaml
from kubernetes import client as k8s

from gpustack_models.kinds import GROUP
from tests.support import kube_update, wait_for
from tests.support.stores import place, put_entries, store
from tests.test_api_authz import bind

DIGEST = "sha256:" + "cd" * 32


def artifact_yaml(name, namespace, label="1", revision=None):
    source = {"repository": "Qwen/Qwen2.5-0.5B"}
    if revision:
        source["revision"] = revision
    return yaml.safe_dump(
        {
            "apiVersion": f"{GROUP}/v1",
            "kind": "ModelArtifact",
            "metadata": {"name": name, "namespace": namespace, "labels": {"tier": label}},
            "spec": {"source": {"huggingFace": source}},
        }
    )


@pytest.fixture
def api(worker_api, kubectl):
    return kubectl


def test_it_lists_the_v1_resources_once_with_their_short_names(api):
    rows = [line.split() for line in api("api-resources", f"--api-group={GROUP}", "--no-headers").stdout.splitlines()]
    by_name = {row[0]: row for row in rows}
    assert sorted(by_name) == ["modelartifacts", "modelprefetches", "nodemodelstores"]
    assert len(rows) == 3  # each once: the storage version is not preferred and carries no short names
    assert by_name["modelartifacts"][1:3] == ["mart", f"{GROUP}/v1"]
    assert by_name["nodemodelstores"][1:3] == ["nms", f"{GROUP}/v1"]
    assert by_name["modelprefetches"][1:3] == ["mpf", f"{GROUP}/v1"]


def test_it_lists_the_category_with_each_kind_once(api, namespace):
    api("apply", "-f", "-", input=artifact_yaml("cat", namespace))
    out = api("get", "gpustack", "-n", namespace, "-o", "name").stdout.split()
    assert out.count(f"modelartifact.{GROUP}/cat") == 1


def test_it_serves_nodemodelstores_at_v1(api, worker_kube):
    worker_kube.create(
        f"/apis/{GROUP}/v1alpha1/nodemodelstores",
        {
            "apiVersion": f"{GROUP}/v1alpha1",
            "kind": "NodeModelStore",
            "metadata": {"name": "yaml-node"},
            "spec": {"models": [{"digest": DIGEST}]},
        },
    )
    try:
        # kubectl 1.36 hides managedFields unless asked: ask, so the rewrite inside them is checked.
        doc = yaml.safe_load(api("get", "nms", "-o", "yaml", "--show-managed-fields").stdout)
        items = [i for i in doc["items"] if i["metadata"]["name"] == "yaml-node"]
        assert items and items[0]["apiVersion"] == f"{GROUP}/v1"
        managed = items[0]["metadata"]["managedFields"]
        assert managed, "the store was created by the worker: it has a field manager"
        assert {entry["apiVersion"] for entry in managed} == {f"{GROUP}/v1"}
    finally:
        worker_kube.delete(f"/apis/{GROUP}/v1alpha1/nodemodelstores/yaml-node")


def test_it_explains_fields_at_v1(api):
    # kube-apiserver aggregates the API's OpenAPI v3 in the background once the APIService is Available:
    # right after registration (this test run first), explain finds no schema for a while.
    explained = wait_for(
        lambda: (p := api("explain", "modelartifact.spec.source.huggingFace", check=False)).returncode == 0 and p,
        timeout=60,
        message="kube-apiserver's aggregated OpenAPI to hold the v1 schemas",
    )
    out = explained.stdout
    assert "VERSION:    v1" in out
    assert "A Hugging Face model repository at a revision." in out
    assert "repository\t<string> -required-" in out


def test_it_applies_client_side_with_a_merge_patch_and_server_side(api, namespace):
    api("apply", "-f", "-", input=artifact_yaml("qwen", namespace, "1"))
    out = api("apply", "-f", "-", "-v=8", input=artifact_yaml("qwen", namespace, "2"))
    assert "configured" in out.stdout
    assert "fieldManager=kubectl-client-side-apply" in out.stderr
    assert "application/merge-patch+json" in out.stderr
    assert "strategic-merge-patch" not in out.stderr
    got = json.loads(api("get", "mart", "qwen", "-n", namespace, "-o", "json").stdout)
    assert got["metadata"]["labels"] == {"tier": "2"}
    ssa = api("apply", "--server-side", "-f", "-", input=artifact_yaml("qwen", namespace, "3"))
    assert "serverside-applied" in ssa.stdout
    got = json.loads(api("get", "mart", "qwen", "-n", namespace, "-o", "json", "--show-managed-fields").stdout)
    assert got["apiVersion"] == f"{GROUP}/v1"
    assert got["metadata"]["labels"] == {"tier": "3"}
    managers = {f["manager"]: f["apiVersion"] for f in got["metadata"]["managedFields"]}
    assert managers["kubectl"] == f"{GROUP}/v1"
    last_applied = json.loads(got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
    assert last_applied["apiVersion"] == f"{GROUP}/v1"


def test_it_prints_the_printer_columns(api, namespace, worker_kube, worker_stack, nodes):
    digest = "sha256:" + uuid.uuid4().hex * 2
    api("apply", "-f", "-", input=artifact_yaml("cols", namespace))
    path = f"/apis/{GROUP}/v1alpha1/namespaces/{namespace}/modelartifacts/cols/status"
    # The worker answers first (the repository is unknown to the test hub: AccessDenied, for good) ...
    wait_for(
        lambda: (worker_kube.get(path).get("status") or {}).get("observedGeneration") == 1,
        timeout=30,
        message="the worker's resolution",
    )
    # ... then, as the worker would have, a resolved status with a 40-character revision and a size; the
    # worker's roll-up then counts the nodes holding the digest.
    status = {
        "resolved": {
            "revision": "0123456789abcdef0123456789abcdef01234567",
            "manifestDigest": digest,
            "fileCount": 3,
            "sizeBytes": 145_390_000_000,
        },
        "conditions": [
            {
                "type": "Resolved",
                "status": "True",
                "reason": "Resolved",
                "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "observedGeneration": 1,
            }
        ],
        "observedGeneration": 1,
    }
    kube_update(worker_kube, path, lambda obj: dict(obj, status=status))
    for name in nodes:
        wait_for(lambda name=name: store(worker_kube, name), timeout=30, message=f"the store of {name}")
    place(worker_kube, namespace, "cols", digest, nodes)  # a node's entries count where the digest is placed
    for name, state in zip(nodes, ("Ready", "Ready", "Downloading")):
        put_entries(worker_kube, name, [{"digest": digest, "state": state, "sizeBytes": 100, "downloadedBytes": 50}])
    wait_for(
        lambda: (worker_kube.get(path).get("status") or {}).get("nodes", {}).get("ready") == 2,
        timeout=30,
        message="the roll-up of the three stores",
    )
    lines = api("get", "mart", "cols", "-n", namespace).stdout.splitlines()
    header = ["NAME", "SOURCE", "REVISION", "COMMIT", "SIZE", "READY", "DOWNLOADING", "RESOLVED", "AGE"]
    assert lines[0].split() == header
    # The branch asked for stays beside the commit it resolved to; the age is shown without -o wide.
    row = lines[1].split()
    assert row[:-1] == ["cols", "hf:Qwen/Qwen2.5-0.5B", "main", "0123456789ab", "135.4Gi", "2", "1", "True"]
    assert row[-1].endswith("s") or row[-1].endswith("m")
    wide = api("get", "mart", "cols", "-n", namespace, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == header


def test_it_sends_changes_over_watch_as_table_rows(api, namespace, cluster, tmp_path):
    api("apply", "-f", "-", input=artifact_yaml("watched", namespace))
    cmd = [
        str(cluster.kubectl),
        f"--kubeconfig={cluster.kubeconfig}",
        f"--cache-dir={tmp_path}/wc",
        "get",
        "mart",
        "-n",
        namespace,
        "-w",
        "--request-timeout=20s",
    ]
    watcher = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in watcher.stdout], daemon=True)
    reader.start()

    def names():
        return [line.split()[0] for line in lines[1:] if line.strip()]

    try:
        # The initial row: the list is done, and the watch goes on from its resourceVersion.
        wait_for(lambda: "watched" in names(), timeout=30, interval=0.05, message="the initial row")
        api("label", "mart", "watched", "-n", namespace, "seen=yes")
        api("apply", "-f", "-", input=artifact_yaml("second", namespace))
        wait_for(lambda: names().count("watched") >= 2 and "second" in names(), timeout=30, interval=0.05,
                 message="the changes as rows")  # fmt: skip
    finally:
        watcher.terminate()
        watcher.wait(10)
        reader.join(10)
        err = watcher.stderr.read()
    assert lines[0].split()[:2] == ["NAME", "SOURCE"], (lines, err)
    assert not err.strip() or "timeout" in err.lower(), err


def test_it_describes_patches_labels_and_deletes(api, namespace):
    api("apply", "-f", "-", input=artifact_yaml("p", namespace))
    described = api("describe", "mart", "p", "-n", namespace).stdout
    assert "API Version:  worker.gpustack.ai/v1" in described and "Repository:  Qwen/Qwen2.5-0.5B" in described
    api("patch", "mart", "p", "-n", namespace, "--type", "merge", "-p", '{"metadata":{"labels":{"m":"1"}}}')
    api(
        "patch",
        "mart",
        "p",
        "-n",
        namespace,
        "--type",
        "json",
        "-p",
        '[{"op":"add","path":"/metadata/labels/j","value":"2"}]',
    )
    api("label", "mart", "p", "-n", namespace, "l=3")
    labels = json.loads(api("get", "mart", "p", "-n", namespace, "-o", "json").stdout)["metadata"]["labels"]
    assert labels == {"tier": "1", "m": "1", "j": "2", "l": "3"}
    default_patch = api("patch", "mart", "p", "-n", namespace, "-p", '{"metadata":{"labels":{"s":"1"}}}', check=False)
    assert default_patch.returncode != 0
    assert "application/strategic-merge-patch+json is not supported" in default_patch.stderr
    assert "accepted media types include" in default_patch.stderr
    api("delete", "mart", "p", "-n", namespace, "--timeout=30s")
    assert api("get", "mart", "p", "-n", namespace, check=False).returncode != 0


def _owned_configmap(api, namespace, owner_name, owner_uid, finalizers=()):
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"dep-{uuid.uuid4().hex[:6]}",
            "namespace": namespace,
            "finalizers": list(finalizers),
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/v1",
                    "kind": "ModelArtifact",
                    "name": owner_name,
                    "uid": owner_uid,
                    "blockOwnerDeletion": True,
                }
            ],
        },
    }
    api("apply", "-f", "-", input=json.dumps(cm))
    return cm["metadata"]["name"]


def test_it_deletes_in_the_foreground_while_a_dependent_exists(api, namespace, garbage_collector):
    api("apply", "-f", "-", input=artifact_yaml("fg", namespace))
    uid = json.loads(api("get", "mart", "fg", "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]
    dependent = _owned_configmap(api, namespace, "fg", uid, finalizers=["example.com/hold"])
    api("delete", "mart", "fg", "-n", namespace, "--cascade=foreground", "--wait=false")

    def held():
        obj = json.loads(api("get", "mart", "fg", "-n", namespace, "-o", "json").stdout)
        return obj["metadata"].get("deletionTimestamp") and "foregroundDeletion" in obj["metadata"].get(
            "finalizers", []
        )

    wait_for(held, timeout=20, message="the foregroundDeletion finalizer")
    # The garbage collector asked for the dependent's deletion; release it.
    wait_for(
        lambda: "deletionTimestamp" in api("get", "cm", dependent, "-n", namespace, "-o", "json").stdout,
        timeout=30,
        message="the dependent to be deleted",
    )
    api("patch", "cm", dependent, "-n", namespace, "--type", "merge", "-p", '{"metadata":{"finalizers":null}}')
    wait_for(
        lambda: api("get", "mart", "fg", "-n", namespace, check=False).returncode != 0,
        timeout=30,
        message="the foreground deletion to complete",
    )


def test_it_orphans_dependents(api, namespace, garbage_collector):
    api("apply", "-f", "-", input=artifact_yaml("orph", namespace))
    uid = json.loads(api("get", "mart", "orph", "-n", namespace, "-o", "json").stdout)["metadata"]["uid"]
    dependent = _owned_configmap(api, namespace, "orph", uid)
    api("delete", "mart", "orph", "-n", namespace, "--cascade=orphan", "--timeout=30s")
    assert api("get", "mart", "orph", "-n", namespace, check=False).returncode != 0
    cm = json.loads(api("get", "cm", dependent, "-n", namespace, "-o", "json").stdout)
    assert not cm["metadata"].get("ownerReferences")


def test_it_refuses_a_delete_whose_uid_precondition_does_not_match(api, namespace, cluster, admin_http):
    api("apply", "-f", "-", input=artifact_yaml("pre", namespace))
    resp = admin_http.delete(
        f"{cluster.server}/apis/{GROUP}/v1/namespaces/{namespace}/modelartifacts/pre",
        json={"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": str(uuid.uuid4())}},
    )
    assert resp.status_code == 409
    assert resp.json()["reason"] == "Conflict"
    assert api("get", "mart", "pre", "-n", namespace, check=False).returncode == 0


def test_it_tells_errors_of_the_storage_at_v1(api, namespace):
    body = yaml.safe_load(artifact_yaml("typo", namespace))
    body["spec"]["sourc"] = body["spec"].pop("source")  # a misspelled field, as a new user writes it
    refused = api("create", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert refused.returncode != 0
    assert 'unknown field "spec.sourc"' in refused.stderr, refused.stderr
    assert "v1alpha1" not in refused.stderr, refused.stderr
    # The same through server-side apply, whose conflicts and errors name versions too.
    body["spec"] = {"source": {"huggingFace": {"repository": "Qwen/Qwen2.5-0.5B"}}, "expectedDigest": "sha256:x"}
    invalid = api("apply", "--server-side", "-f", "-", input=yaml.safe_dump(body), check=False)
    assert invalid.returncode != 0 and "expectedDigest" in invalid.stderr, invalid.stderr
    assert "v1alpha1" not in invalid.stderr, invalid.stderr


def test_a_changed_spec_is_refused_with_what_to_do_instead(api, namespace):
    api("apply", "-f", "-", input=artifact_yaml("frozen", namespace, revision="main"))
    refused = api("apply", "-f", "-", input=artifact_yaml("frozen", namespace, revision="v2"), check=False)
    assert refused.returncode != 0
    said = " ".join(refused.stderr.split())
    assert "spec is immutable after creation: to fetch another repository, revision or set of files, delete" in said
    assert "set the annotation worker.gpustack.ai/requested-at to a new value" in said, said
    assert "v1alpha1" not in said, said
    again = api("annotate", "mart", "frozen", "-n", namespace, "worker.gpustack.ai/requested-at=2026-12-04T10:00:00Z")
    assert again.returncode == 0  # the way the message offers is open


def test_deleting_an_artifact_a_prefetch_names_warns_which_prefetches_still_name_it(
    api, namespace, worker_stack, mirror_db, api_client
):
    from gpustack_models.models import Prefetch

    for name in ("named", "unnamed", "hidden"):
        api("apply", "-f", "-", input=artifact_yaml(name, namespace))
    spec = {"artifactRef": {"name": "named"}, "nodeNames": ["nowhere"], "retention": {"pinned": True}}
    prefetch = {"apiVersion": f"{GROUP}/v1", "kind": "ModelPrefetch", "metadata": {"name": "warm"}, "spec": spec}
    api("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(prefetch))
    wait_for(
        lambda: Prefetch.objects.live().filter(namespace=namespace, name="warm").exists(),
        timeout=30,
        message="the prefetch in the mirror",
    )
    deleted = api("delete", "mart", "named", "-n", namespace)
    said = " ".join(deleted.stderr.split())
    assert said == (
        f"Warning: ModelPrefetch warm (pinned) in {namespace} names this ModelArtifact: it holds nothing on the"
        " nodes until a ModelArtifact named exists again"
    ), deleted.stderr
    assert "deleted" in deleted.stdout
    quiet = api("delete", "mart", "unnamed", "-n", namespace)  # nothing names it: nothing to say
    assert quiet.stderr.strip() == "", quiet.stderr
    # A caller who may delete artifacts but not list prefetches learns no prefetch's name from the warning.
    prefetch["metadata"]["name"], spec["artifactRef"]["name"] = "secretive", "hidden"
    api("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(prefetch))
    wait_for(
        lambda: Prefetch.objects.live().filter(namespace=namespace, name="secretive").exists(),
        timeout=30,
        message="the second prefetch in the mirror",
    )
    rules = [k8s.V1PolicyRule(api_groups=[GROUP], resources=["modelartifacts"], verbs=["get", "delete"])]
    bind(api_client, namespace, "User", "erin", rules, name="artifact-deleter")
    blind = wait_for(
        lambda: (p := api("delete", "mart", "hidden", "-n", namespace, "--as=erin", check=False)).returncode == 0 and p,
        timeout=15,
        message="erin's binding",
    )
    assert "secretive" not in blind.stderr and "Warning" not in blind.stderr, blind.stderr
