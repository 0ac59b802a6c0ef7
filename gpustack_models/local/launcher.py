"""Running the service next to a local control plane (``make run`` and the test stack).

In a cluster the Helm chart installs these objects and the service runs in Pods with its ServiceAccount.
Locally the launcher does the same by hand: it applies the CRDs, RBAC and admission policies with the
admin credentials, gives the service a token of its ServiceAccount (so the admission policies see the
service exactly as in a cluster), makes a serving certificate for ``<service>.<namespace>.svc`` and
registers the APIService pointing at the local process. Where no kubelet runs Pods, it writes the Nodes
and plugin Pods a kubelet would report (``nodes``).
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

import yaml
from django.conf import settings

from gpustack_models import install, kube
from gpustack_models.kinds import GROUP, PUBLIC_VERSION
from gpustack_models.kinds.crd import CRD_DIR
from gpustack_models.local import pki
from gpustack_models.local.cluster import LocalCluster
from gpustack_models.local.nodes import PLUGIN_LABELS, LocalNodes, kubelet_labels

__all__ = ["PLUGIN_LABELS", "TOKEN_SECONDS", "Launcher", "kubelet_labels"]

log = logging.getLogger(__name__)
AGGREGATED_DISCOVERY = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"

TOKEN_SECONDS = 365 * 24 * 3600


class Launcher:
    def __init__(self, cluster: LocalCluster, data_dir: Path):
        self.cluster = cluster
        self.data_dir = Path(data_dir)
        self.pki_dir = self.data_dir / "api-pki"
        self.service_kubeconfig = self.data_dir / "service-kubeconfig"
        self.admin = kube.Kube(kube.load_configuration(str(cluster.kubeconfig)))
        self.nodes = LocalNodes(self.admin)

    # --- kubectl with the admin credentials -----------------------------------------------------------
    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            [str(self.cluster.kubectl), f"--kubeconfig={self.cluster.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def apply(self, objects: list[dict]) -> None:
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gpustack-models-launcher",
            "-f",
            "-",
            input=yaml.safe_dump_all(objects),
        )

    # --- install --------------------------------------------------------------------------------------
    def install(self) -> None:
        """CRDs, namespace, ServiceAccounts, RBAC, the admission policies and the CSIDriver."""
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=gpustack-models-launcher",
            "-f",
            str(CRD_DIR),
        )
        self.kubectl(
            "wait",
            "--for=condition=Established",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=gpustack-models",
            "--timeout=60s",
        )
        objects = install.namespace_objects() + install.rbac_objects() + install.caller_objects()
        objects += install.volume_caller_objects()
        self.apply(objects + install.csi_driver_objects())
        self.install_policies()

    def install_policies(self) -> None:
        self.apply(install.policy_objects())
        # kube-controller-manager type-checks each policy and says so in its status (observedGeneration, with
        # any warnings); a policy with no such status after 30 s is an error, not a wait that passes unseen.
        deadline = time.monotonic() + 30
        for policy in install.policy_objects():
            if policy["kind"] != "ValidatingAdmissionPolicy":
                continue
            name = policy["metadata"]["name"]
            while True:
                current = self.admin.get(f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/{name}")
                if (current.get("status") or {}).get("observedGeneration") == current["metadata"]["generation"]:
                    problems = (current["status"].get("typeChecking") or {}).get("expressionWarnings")
                    if problems:
                        raise RuntimeError(f"admission policy {name}: {problems}")
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"admission policy {name} not type-checked within 30 s (kube-controller-manager's "
                        "validatingadmissionpolicy-status-controller reports it)"
                    )
                time.sleep(0.2)

    def forget_leases(self) -> None:
        """Delete the informers' and beat's Leases (only ``runlocal``, the one instance of each, may)."""
        for name in (settings.LEADER_INFORMERS_LEASE, settings.LEADER_BEAT_LEASE):
            try:
                self.admin.delete(f"/apis/coordination.k8s.io/v1/namespaces/{settings.NAMESPACE}/leases/{name}")
            except kube.NotFound:
                pass

    # --- the service's identity -----------------------------------------------------------------------
    def write_service_kubeconfig(self) -> Path:
        """A kubeconfig carrying a token of the service's ServiceAccount."""
        token = self.service_account_token(settings.SERVICE_ACCOUNT)
        config = yaml.safe_load(self.cluster.token_kubeconfig.read_text())
        config["users"] = [{"name": "service", "user": {"token": token}}]
        config["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": "service"}}]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.service_kubeconfig.write_text(yaml.safe_dump(config))
        self.service_kubeconfig.chmod(0o600)
        return self.service_kubeconfig

    def service_account_token(
        self, name: str, seconds: int = TOKEN_SECONDS, bound_object: dict | None = None, audiences=()
    ) -> str:
        spec = {"expirationSeconds": seconds}
        if bound_object:
            spec["boundObjectRef"] = bound_object
        if audiences:
            spec["audiences"] = list(audiences)
        review = self.admin.create(
            f"/api/v1/namespaces/{settings.NAMESPACE}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return review["status"]["token"]

    # --- serving certificate and registration ---------------------------------------------------------
    def serving_pki(self) -> tuple[Path, Path, bytes]:
        """(cert, key, CA PEM) for the API's HTTPS endpoint; kept across runs."""
        crt, key, ca = self.pki_dir / "serving.crt", self.pki_dir / "serving.key", self.pki_dir / "ca.crt"
        if not (crt.exists() and key.exists() and ca.exists()):
            authority = pki.new_ca("gpustack-models-api-ca")
            authority.write(self.pki_dir, "ca")
            pki.issue(
                authority,
                install.serving_names()[0],
                dns_names=install.serving_names(),
                ip_addresses=("127.0.0.1", "::1"),
                server=True,
            ).write(self.pki_dir, "serving")
        return crt, key, ca.read_bytes()

    def register(self, port: int) -> None:
        """The APIService, and the webhooks by URL (the local API process is outside the cluster): the
        placement webhook, and the model volumes' warnings but in the node-labels placement mode."""
        _crt, _key, ca = self.serving_pki()
        base = f"https://127.0.0.1:{port}"
        objects = install.api_service(ca, port) + [install.placement_webhook(base + install.webhooks.PATH, ca)]
        if settings.PLACEMENT_MODE != "nodeLabels":
            objects.append(install.volume_warnings_webhook(base + install.volume_checks.PATH, ca))
        self.apply(objects)

    def unregister(self, timeout: float | None = None) -> None:
        """Remove the APIService (an unavailable one blocks namespace deletion and garbage collection) and
        the webhooks (a stopped one only delays Pod creates: they fail open)."""
        webhooks = "/apis/admissionregistration.k8s.io/v1"
        for path in (
            f"/apis/apiregistration.k8s.io/v1/apiservices/{PUBLIC_VERSION}.{GROUP}",
            f"{webhooks}/mutatingwebhookconfigurations/{install.webhooks.NAME}",
            f"{webhooks}/validatingwebhookconfigurations/{install.volume_checks.NAME}",
        ):
            try:
                self.admin.delete(path, timeout=timeout)
            except kube.NotFound:
                pass

    def discovered(self) -> bool:
        """Whether kube-apiserver's aggregated discovery (what kubectl reads) lists the public version with
        its resources: kube-apiserver fetches it from the API some time after the APIService is Available."""
        doc = self.admin.get("/apis", headers={"Accept": AGGREGATED_DISCOVERY})
        for group in doc.get("items") or []:
            if (group.get("metadata") or {}).get("name") == GROUP:
                versions = group.get("versions") or []
                return any(
                    v.get("version") == PUBLIC_VERSION and v.get("resources") and v.get("freshness") != "Stale"
                    for v in versions
                )
        return False

    def wait_available(self, timeout: float = 90.0) -> None:
        """Until kube-apiserver reports the APIService Available and serves our discovery, its own and in
        its aggregated discovery (so kubectl finds the resources at once)."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                svc = self.admin.get(f"/apis/apiregistration.k8s.io/v1/apiservices/{PUBLIC_VERSION}.{GROUP}")
                conditions = {c["type"]: c for c in (svc.get("status") or {}).get("conditions", [])}
                available = conditions.get("Available", {})
                last = f"{available.get('reason')}: {available.get('message')}"
                if available.get("status") == "True":
                    listed = self.admin.get(f"/apis/{GROUP}/{PUBLIC_VERSION}")
                    if listed.get("resources") and self.discovered():
                        return
                    last = "Available, not yet in kube-apiserver's aggregated discovery"
            except kube.StatusError as exc:
                last = str(exc)
            time.sleep(0.5)
        raise RuntimeError(f"APIService {PUBLIC_VERSION}.{GROUP} not available after {timeout:.0f}s ({last})")

    # --- nodes and plugin Pods, as a kubelet would report them (``nodes``) ------------------------------
    def plugin_pod_name(self, node: str) -> str:
        return self.nodes.plugin_pod_name(node)

    def register_node(self, node: str, plugin_ip: str, labels: dict | None = None) -> dict:
        """Create ``node`` (Ready) and its plugin Pod, bound to it and Running at ``plugin_ip``."""
        return self.nodes.register_node(node, plugin_ip, labels)

    def set_plugin_ready(self, node: str, plugin_ip: str, ready: bool, pod: dict | None = None) -> None:
        self.nodes.set_plugin_ready(node, plugin_ip, ready, pod)

    def unregister_node(self, node: str) -> None:
        self.nodes.unregister_node(node)

    # --- node plugins -----------------------------------------------------------------------------------
    def plugin_ca(self) -> tuple[Path, Path]:
        """(certificate, key) of the plugin CA the API trusts, made once. The key is the API's alone (it
        issues the plugins' certificates with it: ``GPUSTACK_PLUGIN_CA_KEY_FILE``); no plugin gets it."""
        directory = self.data_dir / "plugin-pki"
        if not ((directory / "ca.crt").exists() and (directory / "ca.key").exists()):
            pki.new_ca("gpustack-models-plugin-ca").write(directory, "ca")
        return directory / "ca.crt", directory / "ca.key"

    def plugin_pki(self, node: str, address: str) -> tuple[Path, Path]:
        """A serving certificate for ``node``'s plugin at ``address``, from the plugin CA the API trusts (for
        tests that serve as a plugin; a plugin the launcher starts asks the API for its certificates)."""
        self.plugin_ca()
        directory = self.data_dir / "plugin-pki"
        authority = pki.KeyPair.load(directory, "ca")
        return pki.issue(authority, node, dns_names=(node,), ip_addresses=(address,), server=True).write(
            directory, node
        )

    def plugin_token(self, node: str, audiences=()) -> str:
        """A token of the plugin's ServiceAccount bound to ``node``'s plugin Pod (so kube-apiserver names
        the node in the token's user info, as for a DaemonSet Pod's projected token), for ``audiences``
        (none: kube-apiserver's)."""
        pod = self.admin.get(f"/api/v1/namespaces/{settings.NAMESPACE}/pods/{self.plugin_pod_name(node)}")
        bound = {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        return self.service_account_token(
            settings.PLUGIN_SERVICE_ACCOUNT, seconds=24 * 3600, bound_object=bound, audiences=audiences
        )

    def plugin_kubeconfig(self, node: str) -> Path:
        """A kubeconfig with a token of the plugin's ServiceAccount bound to its Pod."""
        token = self.plugin_token(node)
        config = yaml.safe_load(self.cluster.token_kubeconfig.read_text())
        config["users"] = [{"name": "plugin", "user": {"token": token}}]
        config["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": "plugin"}}]
        path = self.data_dir / "plugin" / node / "kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def plugin_env(
        self,
        node: str,
        address: str,
        port: int,
        base_env: dict | None = None,
        register: bool = True,
        peer_port: int | None = None,
    ) -> dict:
        """Register ``node`` with its plugin Pod (unless a kubelet runs both: ``register=False``) and return
        the environment of its plugin process (its peer endpoints on ``peer_port``, by default the setting's).
        As in the chart, the plugin asks the API for its serving and client certificates (its Pod IP is
        ``address``), holds no token for anything but kube-apiserver and the API, and trusts the plugin CA's
        certificate alone (never its key)."""
        import os

        if register:
            self.register_node(node, address)
        ca, _key = self.plugin_ca()
        env = dict(base_env if base_env is not None else os.environ)
        for name in ("GPUSTACK_PLUGIN_TLS_CERT_FILE", "GPUSTACK_PLUGIN_TLS_KEY_FILE", "GPUSTACK_PLUGIN_CA_KEY_FILE"):
            env.pop(name, None)
        env.update(
            KUBECONFIG=str(self.plugin_kubeconfig(node)),
            GPUSTACK_DATA_DIR=str(self.data_dir),
            GPUSTACK_PLUGIN_ADDRESS=f"{address}:{port}",
            GPUSTACK_PLUGIN_CERT_FROM_API="true",
            GPUSTACK_PLUGIN_CA_FILE=str(ca),
            GPUSTACK_PLUGIN_CACHE_DIR=str(self.data_dir / "plugin" / node / "cache"),
            GPUSTACK_API_CA_FILE=str(self.pki_dir / "ca.crt"),
            GPUSTACK_PLUGIN_PEER_PORT=str(settings.PLUGIN_PEER_PORT if peer_port is None else peer_port),
        )
        return env
