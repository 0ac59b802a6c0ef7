"""The chart's plugin DaemonSet on the real node: from the image built here (``product_image``), imported
into the node's containerd, rendered by helm from the chart and run by the DaemonSet controller and the
kubelet. The plugin gets its serving certificate from the worker, registers its CSI driver with the kubelet
by itself and serves ``/readyz``; a Pod on the node gets its model through it. The Pod is split by
privilege: the ``mounter`` container (privileged, root) mounts, the ``plugin`` container (everything that
parses network input) runs as the image's non-root user with no capability, as the host's /proc shows. The
node's own kubelet identity (``system:node:<name>``, which the Node authorizer lets read what its Pods
reference) reads none of the chart's Secrets holding a key.

The local control plane has no kube-proxy and its kube-apiserver listens on loopback only, so the plugin
runs in the node's network (``plugin.hostNetwork``) and is told where kube-apiserver and the worker are
(``plugin.env`` and ``plugin.hostAliases``, which a cluster does not need).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import uuid
from pathlib import Path

import requests
import yaml
from django.conf import settings

from gpustack_models import kube
from gpustack_models.local.cluster import free_port
from gpustack_models.plugin.csi import DRIVER_NAME
from tests.support import TEST_STATE, wait_for
from tests.support.chart import key_bearing, pod_specs, referenced_configmaps, referenced_secrets
from tests.support.helm import CHART, run_helm
from tests.support.image_build import IMAGE, import_image
from tests.support.kubernetes import wait_default_service_account
from tests.test_delivery import artifact, consumer, pod_ready, resolved_digest

SERVICE_HOST = f"gpustack-models-api.{settings.NAMESPACE}.svc"


def ca_configmap(launcher) -> dict:
    """The nodes' CA certificates as the chart's ConfigMap holds them, from the test stack's own CAs (the
    plugin asks the test stack's API for its certificates)."""
    ca, _key = launcher.plugin_ca()
    data = {"api-ca.crt": (launcher.pki_dir / "ca.crt").read_text(), "plugin-ca.crt": ca.read_text()}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "gpustack-models-ca"}, "data": data}


def chart_secrets(helm) -> list[dict]:
    """The Secrets the chart writes (its generated certificates, keys included, and Django's key)."""
    args = ["--namespace", settings.NAMESPACE, "--show-only", "templates/certificates.yaml"]
    out = run_helm(helm, "template", "node", str(CHART), *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc and doc["kind"] == "Secret"]


def as_node(real_node, *args: str) -> subprocess.CompletedProcess:
    """kubectl with the node's kubelet credentials (its client certificate: system:node:<name>)."""
    cmd = [str(real_node.cluster.kubectl), f"--kubeconfig={real_node.kubeconfig}", "-n", settings.NAMESPACE, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def pods_on(real_node) -> list[dict]:
    out = real_node.kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={real_node.name}", "-o", "json")
    return json.loads(out.stdout)["items"]


def check_the_node_reads_no_key(real_node, daemonset: dict, secrets: list[dict]) -> None:
    """Once the node can read what its plugin Pod references (the Node authorizer knows the Pod), it is
    refused every Secret of the chart that holds a key. No Pod bound to the node references one: the API's
    Pods, which do, run elsewhere (here the test stack's API is no Pod at all), as api.nodeSelector keeps
    them off the GPU nodes in a cluster."""
    keys = key_bearing(secrets)
    assert keys >= {"gpustack-models-api-serving", "gpustack-models-plugin-ca"}, keys
    wait_for(lambda: (p := plugin_pod(real_node)) and p["spec"].get("nodeName") == real_node.name,
             timeout=120, interval=1, message="the chart's plugin Pod bound to the real node")  # fmt: skip
    ((_, spec),) = pod_specs(daemonset)
    referenced = [("configmap", n) for n in referenced_configmaps(spec)] + [
        ("secret", n) for n in referenced_secrets(spec)
    ]
    assert referenced, "the plugin Pod references nothing the node could read"
    wait_for(lambda: all(as_node(real_node, "get", *r).returncode == 0 for r in referenced), timeout=60,
             message="the node to read what its plugin Pod references")  # fmt: skip
    for name in sorted(keys):
        answer = as_node(real_node, "get", "secret", name, "-o", "name")
        assert answer.returncode != 0 and "forbidden" in answer.stderr.lower(), (name, answer.stdout, answer.stderr)
        assert f'"system:node:{real_node.name}" cannot get resource "secrets"' in answer.stderr, answer.stderr
    # What that states: a node running the plugin and no Pod that references a key (the API's run elsewhere).
    on_node = {p["metadata"]["name"]: referenced_secrets(p["spec"]) & keys for p in pods_on(real_node)}
    assert {pod: names for pod, names in on_node.items() if names} == {}


def values(real_node, cluster, worker_api, port: int, peer_port: int) -> dict:
    repository, tag = IMAGE.rsplit(":", 1)
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "plugin": {
            # The node, not the default's GPU feature discovery label (null drops a default key).
            "nodeSelector": {"kubernetes.io/hostname": real_node.name, "nvidia.com/gpu.present": None},
            "tolerations": [real_node.toleration],
            "kubeletDir": str(real_node.root_dir),
            "cacheDir": str(real_node.dir / "chart-plugin"),
            "port": port,
            "peerPort": peer_port,
            "hostNetwork": True,
            "hostAliases": [{"ip": "127.0.0.1", "hostnames": [SERVICE_HOST]}],
            "env": {
                "KUBERNETES_SERVICE_HOST": "127.0.0.1",
                "KUBERNETES_SERVICE_PORT": str(cluster.ports.apiserver),
                "GPUSTACK_API_URL": f"https://{SERVICE_HOST}:{worker_api.port}",
            },
        },
    }


def plugin_pod(real_node) -> dict | None:
    selector = "app.kubernetes.io/name=gpustack-models-plugin,app.kubernetes.io/instance=node"
    out = real_node.kubectl("-n", settings.NAMESPACE, "get", "pods", "-l", selector, "-o", "json").stdout
    items = json.loads(out)["items"]
    return items[0] if items else None


def ready(pod: dict | None) -> bool:
    conditions = (pod or {}).get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def wait_ready(real_node) -> dict:
    """The plugin's Pod once Ready; else a failure carrying its status, its output and the kubelet's."""
    try:
        return wait_for(lambda: (p := plugin_pod(real_node)) and ready(p) and p, timeout=240, interval=1,
                        message="the chart's plugin Pod to be Ready")  # fmt: skip
    except AssertionError as exc:
        pod = plugin_pod(real_node) or {}
        name = pod.get("metadata", {}).get("name")
        logs = "".join(
            real_node.kubectl("-n", settings.NAMESPACE, "logs", name, "-c", c, check=False).stdout[-3000:]
            for c in ("cache-owner", "mounter", "plugin")
            if name
        )
        status = json.dumps(pod.get("status", {}), indent=1)[-3000:]
        raise AssertionError(
            f"{exc}\nstatus: {status}\nlogs:\n{logs}\nkubelet:\n{real_node.tail_log('kubelet')}"
        ) from None


def drivers(real_node) -> list[str]:
    proc = real_node.kubectl("get", "csinode", real_node.name, "-o", "json", check=False)
    if proc.returncode != 0:
        return []
    return [d["name"] for d in json.loads(proc.stdout)["spec"].get("drivers") or []]


def process_status(*argv: str) -> dict[str, str]:
    """The host's ``/proc/<pid>/status`` of the one process whose command line holds ``argv`` in order."""
    wanted = "\0".join(argv).encode()
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and wanted in (proc / "cmdline").read_bytes():
                status = (proc / "status").read_text()
                found.append(dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line))
        except OSError:
            continue
    assert len(found) == 1, f"{len(found)} processes run {argv}"
    return found[0]


def assert_split_by_privilege(pod: dict, node: str) -> None:
    """The ``plugin`` container: the image's non-root user, no capability, no privilege escalation, as
    admitted and as the host's /proc shows its process; the ``mounter`` container alone is privileged."""
    contexts = {c["name"]: c["securityContext"] for c in pod["spec"]["containers"]}
    assert contexts["plugin"]["runAsNonRoot"] is True and contexts["plugin"]["capabilities"] == {"drop": ["ALL"]}
    assert contexts["mounter"]["privileged"] is True
    plugin = process_status("gpustack_models.plugin", "--role", "node", "--node", node)
    assert plugin["Uid"].split() == [str(contexts["plugin"]["runAsUser"])] * 4 != ["0"] * 4, plugin["Uid"]
    assert all(int(plugin[cap], 16) == 0 for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")), plugin
    assert plugin["NoNewPrivs"].strip() == "1", plugin["NoNewPrivs"]
    mounter = process_status("gpustack_models.plugin", "--role", "mounter", "--node", node)
    assert mounter["Uid"].split() == ["0"] * 4 and int(mounter["CapEff"], 16) != 0, mounter


def mount_a_model(real_node, launcher, worker_kube, hub, tenant: str) -> None:
    """A Pod on the node reads a model the split DaemonSet mounted for it, read-only."""
    admin = launcher.admin
    content = os.urandom(1024 * 1024)
    repo = f"org/chart-{uuid.uuid4().hex[:6]}"
    hub.add_hf_repo(repo, {"config.json": b"{}", "model.safetensors": content})
    artifact(worker_kube, tenant, "qwen", {"huggingFace": {"repository": repo}})
    wait_for(lambda: resolved_digest(worker_kube, tenant, "qwen"), timeout=60, message="resolution")
    write = "{ echo x > /models/m/probe; } 2>&1 && echo WRITABLE || echo READONLY"
    script = f"sha256sum /models/m/model.safetensors; {write}; sleep 3600"
    admin.create(f"/api/v1/namespaces/{tenant}/pods", consumer(real_node, "app", "qwen", script))
    try:
        wait_for(lambda: pod_ready(admin, tenant, "app"), timeout=240, message="the consumer Pod to start")
        lines = wait_for(lambda: (out := real_node.logs(tenant, "app").splitlines()) and len(out) >= 3 and out,
                         timeout=30, message="the consumer's output")  # fmt: skip
        assert lines[0] == f"{hashlib.sha256(content).hexdigest()}  /models/m/model.safetensors"
        assert lines[2] == "READONLY", lines
    finally:  # gone while the mounter still runs: the kubelet unmounts through it
        admin.delete(f"/api/v1/namespaces/{tenant}/pods/app", query={"gracePeriodSeconds": "0"})
        wait_for(lambda: not pod_exists(admin, tenant, "app"), timeout=90, message="the consumer Pod to go")


def pod_exists(admin, namespace: str, name: str) -> bool:
    try:
        admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
    except kube.NotFound:
        return False
    return True


def test_the_charts_plugin_daemonset_runs_on_the_real_node_from_the_image_built_here_and_reads_no_key(
    helm, product_image, real_node, cluster, worker_stack, worker_api, worker_kube, launcher, hub, namespace
):
    import_image(product_image, real_node)
    port, peer_port = free_port(), free_port()
    values_file = TEST_STATE / "chart-node-values.json"
    values_file.write_text(json.dumps(values(real_node, cluster, worker_api, port, peer_port)))
    args = ["--namespace", settings.NAMESPACE, "-f", str(values_file), "--show-only", "templates/plugin.yaml"]
    daemonset = run_helm(helm, "template", "node", str(CHART), *args).stdout
    assert yaml.safe_load(daemonset)["kind"] == "DaemonSet"
    ns = ["-n", settings.NAMESPACE]
    secrets = chart_secrets(helm)
    real_node.kubectl(*ns, "apply", "-f", "-", input=yaml.safe_dump_all([ca_configmap(launcher), *secrets]))
    real_node.kubectl(*ns, "apply", "-f", "-", input=daemonset)
    try:
        check_the_node_reads_no_key(real_node, yaml.safe_load(daemonset), secrets)
        pod = wait_ready(real_node)
        assert pod["spec"]["nodeName"] == real_node.name
        statuses = {s["name"]: s for s in pod["status"]["containerStatuses"]}
        assert set(statuses) == {"mounter", "plugin"}, statuses
        for status in statuses.values():
            assert status["image"].endswith(IMAGE) and status["restartCount"] == 0, status
        # Its CSI driver registered with the kubelet (the plugin speaks the registration protocol itself).
        wait_for(lambda: DRIVER_NAME in drivers(real_node), timeout=60, message="the CSI driver on the CSINode")
        # /readyz over the certificate the worker issued it for its (the node's) IP, checked with the plugins' CA.
        ca, _key = launcher.plugin_ca()
        session = requests.Session()
        session.trust_env = False
        answer = session.get(f"https://{pod['status']['podIP']}:{port}/readyz", verify=str(ca), timeout=10)
        assert answer.status_code == 200, answer.text
        log = real_node.logs(settings.NAMESPACE, pod["metadata"]["name"], "plugin")
        assert f"from the API for {pod['status']['podIP']}," in log, log[-3000:]
        assert_split_by_privilege(pod, real_node.name)
        wait_default_service_account(launcher.admin, namespace)
        mount_a_model(real_node, launcher, worker_kube, hub, namespace)
    finally:
        real_node.kubectl(
            *ns, "delete", "daemonset", "gpustack-models-plugin", "--wait=true", "--timeout=90s", check=False
        )
        wait_for(lambda: plugin_pod(real_node) is None, timeout=90, message="the chart's plugin Pod to go")
        wait_for(lambda: DRIVER_NAME not in drivers(real_node), timeout=60, message="the CSI driver to unregister")
        real_node.kubectl(*ns, "delete", "configmap", "gpustack-models-ca", check=False)
        real_node.kubectl(*ns, "delete", "secret", *(s["metadata"]["name"] for s in secrets), check=False)
