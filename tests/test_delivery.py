"""Delivery to workloads on a real node: the kubelet runs the consumer Pods, the plugin on that node serves
them the model through its CSI driver (registered with the kubelet by the plugin itself), the worker
authorizes each mount from the cluster, and the real kube-scheduler places Pods.

The node's plugin runs as a process on the host beside a placeholder Pod of its own (hostNetwork, on that
node, run by the kubelet): the Pod is what the worker sees as the node's plugin and what the plugin's
bound token is bound to, as a DaemonSet Pod would be; the process is the plugin itself, on the host's
mount namespace as the DaemonSet's privileged container with Bidirectional propagation would be.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import pytest

from gpustack_models import kube
from gpustack_models.kinds import GROUP
from gpustack_models.models import MountReference
from tests.support.kubernetes import wait_default_service_account
from tests.support.plugins import PluginProcess
from tests.support.stores import STORAGE, digests, reconciled, store, unannotated
from tests.support.waiting import wait_for

DRIVER = "model.csi.gpustack.ai"
MODEL_FILE = "model.safetensors"


@pytest.fixture
def tenant(launcher, namespace):
    """A fresh namespace whose default ServiceAccount exists (Pods are refused until it does)."""
    wait_default_service_account(launcher.admin, namespace)
    return namespace


@pytest.fixture
def other_tenant(core, launcher):
    from tests.support.cluster import fresh_namespace

    gen = fresh_namespace(core)
    name = next(gen)
    wait_default_service_account(launcher.admin, name)
    yield name
    next(gen, None)


def pod_ready(admin, namespace, name):
    pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    conditions = {c["type"]: c["status"] for c in (pod.get("status") or {}).get("conditions") or []}
    return pod if conditions.get("Ready") == "True" and pod["status"].get("podIP") else None


def csi_drivers(admin, node):
    try:
        return [d["name"] for d in admin.get(f"/apis/storage.k8s.io/v1/csinodes/{node}")["spec"].get("drivers") or []]
    except kube.NotFound:
        return []


@pytest.fixture(scope="module")
def node_plugin(real_node, worker_stack, worker_api, launcher):
    """The real node's plugin: its placeholder Pod Running on the node, the plugin process serving the CSI
    driver the kubelet registered through its plugin watcher."""
    from django.conf import settings

    from gpustack_models.local.launcher import PLUGIN_LABELS

    admin, namespace = launcher.admin, settings.NAMESPACE
    name = launcher.plugin_pod_name(real_node.name)
    pod = real_node.pod(name, ["sleep", "1000000"], hostNetwork=True, nodeName=real_node.name,
                        serviceAccountName=settings.PLUGIN_SERVICE_ACCOUNT, automountServiceAccountToken=False,
                        restartPolicy="Always")  # fmt: skip
    pod["metadata"]["labels"] = dict(PLUGIN_LABELS)
    admin.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    running = wait_for(lambda: pod_ready(admin, namespace, name), timeout=90, message="the plugin's Pod")
    root = Path(real_node.root_dir)
    env = {
        "GPUSTACK_PLUGIN_CSI_SOCKET": str(root / "plugins" / DRIVER / "csi.sock"),
        "GPUSTACK_PLUGIN_REGISTRATION_DIR": str(root / "plugins_registry"),
        "GPUSTACK_PLUGIN_KUBELET_DIR": str(root),
    }
    (root / "plugins" / DRIVER).mkdir(parents=True, exist_ok=True)
    plugin = PluginProcess(launcher, worker_api, real_node.name, running["status"]["podIP"], env, register=False)
    plugin.start()
    try:
        wait_for(lambda: DRIVER in csi_drivers(admin, real_node.name), timeout=60, message="the kubelet to register")
        yield plugin
    finally:
        plugin.stop()
        admin.delete(f"/api/v1/namespaces/{namespace}/pods/{name}", query={"gracePeriodSeconds": "0"})


def artifact(worker_kube, namespace, name, source):
    body = {"apiVersion": f"{GROUP}/v1alpha1", "kind": "ModelArtifact", "metadata": {"name": name}}
    return worker_kube.create(f"{STORAGE}/namespaces/{namespace}/modelartifacts", dict(body, spec={"source": source}))


def resolved_digest(worker_kube, namespace, name):
    obj = worker_kube.get(f"{STORAGE}/namespaces/{namespace}/modelartifacts/{name}")
    return ((obj.get("status") or {}).get("resolved") or {}).get("manifestDigest")


def consumer(real_node, name, artifact_name, script, **attributes):
    volume = {"driver": DRIVER, "readOnly": True, "volumeAttributes": {"artifact": artifact_name, **attributes}}
    pod = real_node.pod(name, ["sh", "-c", script], nodeSelector={"kubernetes.io/hostname": real_node.name})
    pod["spec"]["volumes"] = [{"name": "model", "csi": volume}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "model", "mountPath": "/models/m", "readOnly": True}]
    return pod


def events_of(admin, namespace, pod):
    answer = admin.get(f"/api/v1/namespaces/{namespace}/events", query={"fieldSelector": f"involvedObject.name={pod}"})
    return [(e.get("reason"), e.get("message") or "") for e in answer.get("items") or []]


def mounts_of(pod_uid: str) -> list[str]:
    """The mount points of a Pod's CSI volumes on this host."""
    with open("/proc/self/mountinfo") as fh:
        return [line.split()[4] for line in fh if f"/pods/{pod_uid}/volumes/kubernetes.io~csi/" in line.split()[4]]


def test_a_pod_gets_its_model_once_ready_read_only_and_lets_it_go(
    node_plugin, real_node, launcher, worker_kube, tenant, hub, mirror_db
):
    admin = launcher.admin
    content = os.urandom(3 * 1024 * 1024)
    repo = f"org/d-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}", MODEL_FILE: content})
    # About four seconds of download (one connection: the file is below the split threshold): the kubelet,
    # retrying after 0.5, 1, 2 and 4 s, sees it in progress, and mounts it at its next try.
    hub.faults.throttle(MODEL_FILE, bytes_per_second=768 * 1024)
    artifact(worker_kube, tenant, "qwen", {"huggingFace": {"repository": repo}})
    digest = wait_for(lambda: resolved_digest(worker_kube, tenant, "qwen"), timeout=60, message="resolution")
    write = "{ echo x > /models/m/probe; } 2>&1 && echo WRITABLE || echo READONLY"  # its error, in order
    script = f"sha256sum /models/m/{MODEL_FILE}; {write}; sleep 3600"
    admin.create(f"/api/v1/namespaces/{tenant}/pods", consumer(real_node, "app", "qwen", script))

    def progress_event():
        messages = [m for reason, m in events_of(admin, tenant, "app") if reason == "FailedMount"]
        return next((m for m in messages if "model qwen is downloading on this node:" in m and "%" in m), None)

    seen = wait_for(progress_event, timeout=120, message="a FailedMount event with the download's progress")
    assert real_node.name not in seen.split("model qwen")[1]  # the tenant is told how far, not which node
    pod = wait_for(lambda: pod_ready(admin, tenant, "app"), timeout=240, message="the Pod to start")
    assert pod["spec"]["nodeName"] == real_node.name

    def output():
        lines = real_node.logs(tenant, "app").splitlines()
        return lines if len(lines) >= 3 else None

    lines = wait_for(output, timeout=30, message="the consumer's output")
    assert lines[0] == f"{hashlib.sha256(content).hexdigest()}  /models/m/{MODEL_FILE}"
    assert lines[1] == "sh: can't create /models/m/probe: Read-only file system"
    assert lines[2] == "READONLY"
    uid = pod["metadata"]["uid"]
    assert len(mounts_of(uid)) == 1
    assert digest in digests(store(worker_kube, real_node.name))

    # The plugin restarts: the mount stays, and so does the reference: the node's spec.models as the worker
    # decides it after the restart, and as the restarted plugin has seen it, still holds the digest.
    node_plugin.stop()
    node_plugin.start()
    assert len(mounts_of(uid)) == 1
    assert pod_ready(admin, tenant, "app")
    try:
        after = reconciled(admin, worker_kube, real_node.name, observed=True)
    finally:
        unannotated(admin, real_node.name)
    assert {"digest": digest, "pinned": False} in after["spec"]["models"], after["spec"]["models"]
    assert list(MountReference.objects.filter(node=real_node.name, pod_uid=uid).values_list("digest", flat=True)) == [
        digest
    ]

    # Deleting the artifact in use waits for its Pod (the protection finalizer).
    worker_kube.delete(f"{STORAGE}/namespaces/{tenant}/modelartifacts/qwen")
    held = worker_kube.get(f"{STORAGE}/namespaces/{tenant}/modelartifacts/qwen")
    assert held["metadata"].get("deletionTimestamp")
    assert "worker.gpustack.ai/model-artifact-protection" in held["metadata"]["finalizers"]

    admin.delete(f"/api/v1/namespaces/{tenant}/pods/app")
    wait_for(lambda: not mounts_of(uid), timeout=60, message="the kubelet to unmount the volume")

    def artifact_gone():
        try:
            worker_kube.get(f"{STORAGE}/namespaces/{tenant}/modelartifacts/qwen")
            return False
        except kube.NotFound:
            return True

    wait_for(artifact_gone, timeout=60, message="the artifact to go once its Pod is gone")
    # Nothing references the digest on the node any more: it is collected after the grace.
    wait_for(lambda: digest not in digests(store(worker_kube, real_node.name)), timeout=60,
             message="the digest to leave spec.models")  # fmt: skip


def test_pods_mount_models_from_an_oci_registry_byte_for_byte(
    node_plugin, real_node, launcher, worker_kube, tenant, core, registry
):
    """A ModelPack artifact (a layer per file) and a model image (files inside its gzip-compressed tar layer, as
    image builders push them)."""
    from tests.support.oci_images import push_image, tar_layer
    from tests.test_oci_sources import FILES, oracle_digest, pull_secret

    admin = launcher.admin
    pusher = registry.add_user(f"{tenant}-ci", uuid.uuid4().hex, pull=f"{tenant}/", push=f"{tenant}/")
    puller = registry.add_user(f"{tenant}-pull", uuid.uuid4().hex, pull=f"{tenant}/")
    registry.push_modelpack(f"{tenant}/model", "v1", FILES, pusher)
    imaged = FILES | {"image.txt": b"only in the image"}  # other content: fetched from inside the layer
    layer = tar_layer({f"models/{p}": b for p, b in imaged.items()})
    image = push_image(registry, f"{tenant}/image", pusher, "v1", [(layer, "gzip")])
    pull_secret(core, tenant, "pull", registry.host, puller)
    for name, reference, files in (("packed", f"{registry.host}/{tenant}/model:v1", FILES), ("imaged", image, imaged)):
        artifact(worker_kube, tenant, name, {"oci": {"reference": reference, "secretRef": {"name": "pull"}}})
        digest = wait_for(lambda n=name: resolved_digest(worker_kube, tenant, n), timeout=60, message="resolution")
        assert digest == oracle_digest(files)
        paths = sorted(files)
        script = f"cd /models/m && sha256sum {' '.join(paths)}; sleep 3600"
        admin.create(f"/api/v1/namespaces/{tenant}/pods", consumer(real_node, f"{name}-app", name, script))
        wait_for(lambda n=name: pod_ready(admin, tenant, f"{n}-app"), timeout=240, message="the Pod to start")

        def output(n=name, wanted=paths):
            lines = real_node.logs(tenant, f"{n}-app").splitlines()
            return lines if len(lines) >= len(wanted) else None

        expected = [f"{hashlib.sha256(files[p]).hexdigest()}  {p}" for p in paths]
        assert wait_for(output, timeout=30, message="the consumer's output") == expected
        admin.delete(f"/api/v1/namespaces/{tenant}/pods/{name}-app", query={"gracePeriodSeconds": "0"})


def test_a_pod_mounts_a_model_from_s3_byte_for_byte(node_plugin, real_node, launcher, worker_kube, tenant, core, s3):
    from tests.test_oci_sources import FILES, oracle_digest

    admin = launcher.admin
    bucket = s3.create_bucket(f"d-{uuid.uuid4().hex[:10]}", versioned=True)
    for path, data in FILES.items():
        s3.put(bucket, f"m/{path}", data)
    keys = {"accessKeyId": s3.access_key, "secretAccessKey": s3.secret_key}
    core.create_namespaced_secret(tenant, {"metadata": {"name": "keys"}, "stringData": keys})
    source = {"endpoint": s3.url, "bucket": bucket, "prefix": "m", "region": s3.region, "secretRef": {"name": "keys"}}
    artifact(worker_kube, tenant, "stored", {"s3": source})
    digest = wait_for(lambda: resolved_digest(worker_kube, tenant, "stored"), timeout=60, message="resolution")
    assert digest == oracle_digest(FILES)
    paths = sorted(FILES)
    script = f"cd /models/m && sha256sum {' '.join(paths)}; sleep 3600"
    admin.create(f"/api/v1/namespaces/{tenant}/pods", consumer(real_node, "s3-app", "stored", script))
    wait_for(lambda: pod_ready(admin, tenant, "s3-app"), timeout=240, message="the Pod to start")

    def output():
        lines = real_node.logs(tenant, "s3-app").splitlines()
        return lines if len(lines) >= len(paths) else None

    expected = [f"{hashlib.sha256(FILES[p]).hexdigest()}  {p}" for p in paths]
    assert wait_for(output, timeout=30, message="the consumer's output") == expected
    admin.delete(f"/api/v1/namespaces/{tenant}/pods/s3-app", query={"gracePeriodSeconds": "0"})


def refusal(admin, namespace, pod, fragment):
    """The FailedMount message of ``pod`` that contains ``fragment``."""

    def found():
        return next(
            (m for reason, m in events_of(admin, namespace, pod) if reason == "FailedMount" and fragment in m), None
        )

    return wait_for(found, timeout=90, message=f"a FailedMount event of {pod} saying {fragment!r}")


def test_mounts_the_cluster_does_not_allow_are_refused_and_nothing_is_mounted(
    node_plugin, real_node, launcher, worker_kube, tenant, other_tenant, hub, cluster
):
    admin = launcher.admin
    repo = f"org/r-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}", MODEL_FILE: b"m" * 4096})
    artifact(worker_kube, tenant, "mine", {"huggingFace": {"repository": repo}})
    digest = wait_for(lambda: resolved_digest(worker_kube, tenant, "mine"), timeout=60, message="resolution")
    artifact(worker_kube, tenant, "nowhere", {"huggingFace": {"repository": f"org/missing-{uuid.uuid4().hex[:6]}"}})
    artifact(worker_kube, tenant, "claimed", {"persistentVolumeClaim": {"claimName": "weights"}})
    wrong = "sha256:" + "0" * 64
    cases = [
        (other_tenant, "borrow", "mine", {}, "not found"),
        (tenant, "unresolved", "nowhere", {}, "not resolved"),
        (tenant, "claim", "claimed", {}, "mount the claim itself"),
        (tenant, "pinned", "mine", {"expectedDigest": wrong}, "does not match"),
    ]
    for namespace, name, art, attributes, _ in cases:
        admin.create(f"/api/v1/namespaces/{namespace}/pods", consumer(real_node, name, art, "sleep 3600", **attributes))
    for namespace, name, art, _, fragment in cases:
        message = refusal(admin, namespace, name, fragment)
        assert art in message, message
        pod = admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        assert pod["status"]["phase"] == "Pending", pod["status"]
        assert mounts_of(pod["metadata"]["uid"]) == []
    # None of them made the node want anything, and no artifact is protected by them.
    assert digest not in digests(store(worker_kube, real_node.name))
    mine = worker_kube.get(f"{STORAGE}/namespaces/{tenant}/modelartifacts/mine")
    assert "worker.gpustack.ai/model-artifact-protection" not in (mine["metadata"].get("finalizers") or [])
    print(json.dumps([refusal(admin, ns, name, frag) for ns, name, _, _, frag in cases], indent=1))
