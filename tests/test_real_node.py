"""The suite's real node and what the local control plane does for it: the scheduler places Pods, the
kubelet runs them in containerd and serves their logs, claims and volumes are released, and the new
credentials (the kubelet's, kube-apiserver's towards kubelets and webhooks) reach no further than meant."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests
import yaml
from kubernetes import client as k8s

from gpustack_models.local import pki
from gpustack_models.local.cluster import CLIENT_CERTS, WEBHOOK_CLIENT_USER, LocalCluster
from tests.support import hoststate, wait_default_service_account, wait_for
from tests.support.kubelet import NODE_LABEL, clean_up


@pytest.fixture
def node_ns(launcher, namespace):
    """A fresh namespace whose default ServiceAccount exists (Pods are refused until it does)."""
    wait_default_service_account(launcher.admin, namespace)
    return namespace


def apply(kubectl, namespace, obj):
    return kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(obj))


def pod_of(core, namespace, name):
    return core.read_namespaced_pod(name, namespace)


def gone(read):
    try:
        read()
        return False
    except k8s.ApiException as exc:
        if exc.status == 404:
            return True
        raise


def test_the_scheduler_places_a_pod_on_the_real_node_and_kubectl_reads_its_output(real_node, node_ns, core, kubectl):
    payload = f"gpustack {uuid.uuid4().hex}"
    script = f"tr '\\0' ' ' </proc/1/cmdline; echo; echo hello from $(hostname); printf '{payload}' | sha256sum"
    apply(kubectl, node_ns, real_node.pod("hash", ["sh", "-c", script]))
    pod = wait_for(
        lambda: (p := pod_of(core, node_ns, "hash")).status.phase in ("Succeeded", "Failed") and p,
        timeout=60,
        message="the Pod to finish",
    )
    assert pod.status.phase == "Succeeded", pod.status
    assert pod.spec.node_name == real_node.name  # bound by kube-scheduler: the manifest names no node
    scheduled = next(c for c in pod.status.conditions if c.type == "PodScheduled")
    assert scheduled.status == "True"
    lines = real_node.logs(node_ns, "hash").splitlines()
    assert lines[0] == f"sh -c {script} "  # PID 1 is the container's own process, not the host's
    assert lines[1] == "hello from hash"
    assert lines[2] == f"{hashlib.sha256(payload.encode()).hexdigest()}  -"
    # The kubelet reports the container's exit through the API as it would in any cluster.
    (status,) = pod.status.container_statuses
    assert status.state.terminated.exit_code == 0
    assert status.image == real_node.images["busybox"]


def test_a_node_registered_without_a_kubelet_gets_no_pod(real_node, node_ns, core, kubectl, launcher):
    """The suite's other tests register Nodes with no allocatable resources: the scheduler never binds a
    Pod there, even one that would rather run there and tolerates everything."""
    fake = f"fake-{uuid.uuid4().hex[:6]}"
    launcher.register_node(fake, "127.0.0.250")
    try:
        only_fake = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [fake]}]}
                    ]
                }
            }
        }
        apply(
            kubectl, node_ns, real_node.pod("stuck", ["true"], affinity=only_fake, tolerations=[{"operator": "Exists"}])
        )
        prefer_fake = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": only_fake["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
                            "nodeSelectorTerms"
                        ][0],
                    }
                ]
            }
        }
        apply(kubectl, node_ns, real_node.pod("placed", ["true"], affinity=prefer_fake))

        def unschedulable():
            conditions = pod_of(core, node_ns, "stuck").status.conditions or []
            return next((c for c in conditions if c.type == "PodScheduled" and c.reason == "Unschedulable"), None)

        condition = wait_for(unschedulable, timeout=30, message="the scheduler to refuse the fake node")
        assert "Too many pods" in condition.message, condition.message
        placed = wait_for(lambda: pod_of(core, node_ns, "placed").spec.node_name, timeout=30, message="a binding")
        assert placed == real_node.name
        assert pod_of(core, node_ns, "stuck").spec.node_name is None
    finally:
        launcher.unregister_node(fake)


def test_only_pods_that_tolerate_the_real_node_run_there(real_node, node_ns, core, kubectl):
    """Pods of other tests (no toleration) never land on a node that would really run them."""
    plain = real_node.pod("plain", ["true"])
    plain["spec"].pop("tolerations")
    apply(kubectl, node_ns, plain)

    def refused():
        conditions = pod_of(core, node_ns, "plain").status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    wait_for(refused, timeout=30, message="the untolerating Pod to stay unscheduled")
    assert pod_of(core, node_ns, "plain").spec.node_name is None
    labels = real_node.node()["metadata"]["labels"]
    assert labels[NODE_LABEL] == "kubelet" and labels["kubernetes.io/hostname"] == real_node.name


def test_deleting_a_running_pod_completes_and_the_node_stays_ready(real_node, node_ns, core, kubectl):
    apply(kubectl, node_ns, real_node.pod("sleeper", ["sleep", "3600"]))
    pod = wait_for(
        lambda: (p := pod_of(core, node_ns, "sleeper")).status.phase == "Running" and p,
        timeout=60,
        message="the Pod to run",
    )
    pod_dir = real_node.root_dir / "pods" / pod.metadata.uid
    assert pod_dir.is_dir()
    # kubectl exec goes through kube-apiserver to the kubelet, as logs do.
    out = kubectl(
        "exec", "-n", node_ns, "sleeper", "--", "cat", "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    )
    assert out.stdout == node_ns
    kubectl("delete", "pod", "-n", node_ns, "sleeper", "--timeout=60s")
    assert gone(lambda: pod_of(core, node_ns, "sleeper"))
    wait_for(lambda: not pod_dir.exists(), timeout=30, message="the kubelet to remove the Pod's directory")
    assert real_node.is_ready()


def test_a_claim_in_use_is_kept_until_its_pod_goes_then_deleted(node_ns, core, kubectl, launcher):
    """pvc-protection: the finalizer holds a claim a scheduled Pod uses, and the controller releases it
    after (on a Node without a kubelet, so the Pod stays as it is until it is deleted); a claim no Pod uses,
    deleted at the same time, goes at once."""
    for name in ("data", "spare"):
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
        }
        apply(kubectl, node_ns, claim)
        assert core.read_namespaced_persistent_volume_claim(name, node_ns).metadata.finalizers == [
            "kubernetes.io/pvc-protection"
        ]
    user = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "user"},
        "spec": {
            "nodeName": f"claims-{uuid.uuid4().hex[:6]}",
            "containers": [
                {"name": "c", "image": "example.invalid/none", "volumeMounts": [{"name": "d", "mountPath": "/d"}]}
            ],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    launcher.register_node(user["spec"]["nodeName"], "127.0.0.252")
    try:
        apply(kubectl, node_ns, user)
        kubectl("delete", "pvc", "-n", node_ns, "data", "spare", "--wait=false")
        # The controller has handled both deletions once the unused claim is gone.
        wait_for(lambda: gone(lambda: core.read_namespaced_persistent_volume_claim("spare", node_ns)), timeout=30,
                 message="the unused claim to go")  # fmt: skip
        pending = core.read_namespaced_persistent_volume_claim("data", node_ns)
        assert pending.metadata.deletion_timestamp is not None  # held while the Pod exists
        kubectl("delete", "pod", "-n", node_ns, "user", "--grace-period=0", "--force", "--timeout=30s")
    finally:
        launcher.unregister_node(user["spec"]["nodeName"])
    wait_for(
        lambda: gone(lambda: core.read_namespaced_persistent_volume_claim("data", node_ns)),
        timeout=30,
        message="the claim to go once nothing uses it",
    )


def test_a_volume_is_deleted_without_hanging(core, kubectl):
    name = f"pv-{uuid.uuid4().hex[:8]}"
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "hostPath": {"path": "/nonexistent"},
            "persistentVolumeReclaimPolicy": "Retain",
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(volume))
    assert core.read_persistent_volume(name).metadata.finalizers == ["kubernetes.io/pv-protection"]
    kubectl("delete", "pv", name, "--timeout=30s")
    assert gone(lambda: core.read_persistent_volume(name))


# --- credentials -----------------------------------------------------------------------------------------
def cert_session(cluster, crt, key) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.cert = (str(crt), str(key))
    return session


def whoami(cluster, session) -> dict:
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    resp = session.post(f"{cluster.server}/apis/authentication.k8s.io/v1/selfsubjectreviews", json=review)
    assert resp.status_code == 201, resp.text
    return resp.json()["status"]["userInfo"]


def test_the_kubelet_credential_reaches_only_its_own_node(real_node, cluster, launcher, node_ns, core, kubectl):
    """Node authorizer + NodeRestriction: the kubelet's certificate cannot touch another Node, read a
    Secret none of its Pods uses, or give its own Node a label reserved to administrators."""
    kubelet = cert_session(
        cluster, real_node.dir / "pki" / "kubelet-client.crt", real_node.dir / "pki" / "kubelet-client.key"
    )
    user = whoami(cluster, kubelet)
    assert user["username"] == f"system:node:{real_node.name}" and "system:nodes" in user["groups"]
    other = f"other-{uuid.uuid4().hex[:6]}"
    launcher.register_node(other, "127.0.0.251")
    try:
        patch = {"metadata": {"labels": {"stolen": "yes"}}}
        headers = {"Content-Type": "application/merge-patch+json"}
        denied = kubelet.patch(f"{cluster.server}/api/v1/nodes/{other}", data=json.dumps(patch), headers=headers)
        assert denied.status_code == 403, denied.text
        assert "stolen" not in core.read_node(other).metadata.labels
    finally:
        launcher.unregister_node(other)
    core.create_namespaced_secret(
        node_ns, k8s.V1Secret(metadata=k8s.V1ObjectMeta(name="private"), string_data={"k": "v"})
    )
    assert kubelet.get(f"{cluster.server}/api/v1/namespaces/{node_ns}/secrets/private").status_code == 403
    reserved = {"metadata": {"labels": {"node-restriction.kubernetes.io/gpu": "all"}}}
    resp = kubelet.patch(
        f"{cluster.server}/api/v1/nodes/{real_node.name}",
        data=json.dumps(reserved),
        headers={"Content-Type": "application/merge-patch+json"},
    )
    assert resp.status_code == 403, resp.text
    assert "node-restriction.kubernetes.io/gpu" not in real_node.node()["metadata"]["labels"]


def test_the_kubelet_api_answers_only_whom_kube_apiserver_authorizes(real_node, cluster):
    base = f"https://{cluster.advertise_address}:{real_node.port}"
    anonymous = requests.Session()
    anonymous.trust_env = False
    anonymous.verify = str(cluster.pki_path("ca.crt"))  # the kubelet serves a certificate of the cluster CA
    assert anonymous.get(f"{base}/pods", timeout=10).status_code == 401
    tenant = requests.Session()
    tenant.trust_env = False
    tenant.verify = anonymous.verify
    tenant.headers["Authorization"] = f"Bearer {cluster.tokens()['alice']}"
    assert tenant.get(f"{base}/pods", timeout=10).status_code == 403  # authenticated, not authorized
    assert tenant.get(f"{base}/runningpods/", timeout=10).status_code == 403
    apiserver = cert_session(cluster, cluster.pki_path("kubelet-client.crt"), cluster.pki_path("kubelet-client.key"))
    resp = apiserver.get(f"{base}/pods", timeout=10)
    assert resp.status_code == 200 and resp.json()["kind"] == "PodList"


def test_kube_apiserver_calls_webhooks_as_its_own_user_who_may_do_nothing_else(cluster):
    config = yaml.safe_load((cluster.state_dir / "admission-config.yaml").read_text())
    assert {p["name"] for p in config["plugins"]} == {"MutatingAdmissionWebhook", "ValidatingAdmissionWebhook"}
    (kubeconfig,) = {p["configuration"]["kubeConfigFile"] for p in config["plugins"]}
    (entry,) = yaml.safe_load(open(kubeconfig))["users"]
    assert entry["name"] == "*"
    webhook = cert_session(cluster, entry["user"]["client-certificate"], entry["user"]["client-key"])
    user = whoami(cluster, webhook)
    assert user["username"] == WEBHOOK_CLIENT_USER
    assert user["groups"] == ["system:authenticated"]
    for path in ("/api/v1/pods", "/api/v1/nodes", "/api/v1/namespaces/default/secrets"):
        assert webhook.get(f"{cluster.server}{path}").status_code == 403, path


def test_an_earlier_state_directory_is_completed_not_regenerated(cluster, tmp_path):
    state = LocalCluster(tmp_path, bin_dir=cluster.bin_dir, advertise_address="192.0.2.10")
    state.prepare()
    kept = {f: (tmp_path / "pki" / f).read_bytes() for f in ("ca.crt", "ca.key", "admin.crt", "sa.key")}
    for name in ("kube-scheduler", "kubelet-client", "webhook-client"):  # what an older version did not make
        (tmp_path / "pki" / f"{name}.crt").unlink()
        (tmp_path / "pki" / f"{name}.key").unlink()
    state.prepare()
    assert {f: (tmp_path / "pki" / f).read_bytes() for f in kept} == kept
    ca = pki.KeyPair.load(tmp_path / "pki", "ca")
    for name, (user, groups) in CLIENT_CERTS.items():
        cert = pki.KeyPair.load(tmp_path / "pki", name).cert
        cert.verify_directly_issued_by(ca.cert)
        assert cert.subject.rfc4514_string() == ",".join([f"CN={user}", *(f"O={g}" for g in groups)])
    # A new cluster CA reissues everything it signs.
    (tmp_path / "pki" / "ca.crt").unlink()
    state.prepare()
    new_ca = pki.KeyPair.load(tmp_path / "pki", "ca")
    pki.KeyPair.load(tmp_path / "pki", "admin").cert.verify_directly_issued_by(new_ca.cert)
    pki.KeyPair.load(tmp_path / "pki", "apiserver").cert.verify_directly_issued_by(new_ca.cert)


# --- what a session that died leaves, cleaned up by the next -------------------------------------------
def _leftover_process(*argv: str) -> subprocess.Popen:
    code = "import time; time.sleep(600)"
    return subprocess.Popen([sys.executable, "-c", code, *argv], start_new_session=True)


def test_a_dead_sessions_node_is_stopped_and_the_host_put_back(tmp_path):
    """``clean_up`` of a record as a killed session leaves it: its kubelet, shims and Pod processes still
    running, mounts under the node directory (the kubelet's shared bind mount and a volume), the Pods'
    cgroups, the CNI bridge and a KUBE-* iptables chain. Everything goes, and so does the record."""
    tag = uuid.uuid4().hex[:8]
    node_dir, cgroup_root, bridge, chain = (
        tmp_path / "node",
        f"/gpustack-models-test-{tag}",
        f"gpt{tag}",
        f"KUBE-T-{tag}",
    )
    before = hoststate.record(bridge, cgroup_root)
    for key in ("sysctls", "paths", "mounts"):  # host-wide state other sessions may be changing right now
        del before[key]
    volume = node_dir / "kubelet" / "pods" / "uid" / "volumes" / "v"
    volume.mkdir(parents=True)
    for cmd in (
        ["mount", "--bind", node_dir / "kubelet", node_dir / "kubelet"],
        ["mount", "--make-rshared", node_dir / "kubelet"],
        ["mount", "-t", "tmpfs", "tmpfs", volume],
        ["ip", "link", "add", "name", bridge, "type", "bridge"],
        ["iptables", "-N", chain],
        ["iptables", "-A", "OUTPUT", "-m", "comment", "--comment", "a leftover", "-j", chain],
    ):
        subprocess.run([str(c) for c in cmd], check=True)
    kubelet = _leftover_process(str(node_dir / "kubelet-config.yaml"))
    shim = _leftover_process("-address", str(node_dir / "containerd" / "containerd.sock"))
    in_pod = _leftover_process()
    for hierarchy in hoststate.cgroup_hierarchies():
        (hierarchy / cgroup_root.lstrip("/") / "kubepods" / "besteffort").mkdir(parents=True)
    memory = Path("/sys/fs/cgroup/memory") / cgroup_root.lstrip("/") / "kubepods" / "besteffort"
    (memory / "cgroup.procs").write_text(str(in_pod.pid))
    record_file = tmp_path / "record.json"
    record_file.write_text("{}")

    clean_up({"dir": str(node_dir), "pids": {"kubelet": kubelet.pid}, "host": before}, record_file)

    for proc in (kubelet, shim, in_pod):
        assert proc.wait(timeout=5) is not None
    assert hoststate.mounts_under([str(node_dir)]) == []
    assert not any((h / cgroup_root.lstrip("/")).exists() for h in hoststate.cgroup_hierarchies())
    assert not Path(f"/sys/class/net/{bridge}").exists()
    assert chain not in hoststate.iptables_chains()["filter"]
    assert chain not in subprocess.run(["iptables-save", "-t", "filter"], capture_output=True, text=True).stdout
    assert not record_file.exists()
