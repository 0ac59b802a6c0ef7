"""The control plane's state directory (see ``cluster``): its layout, and the files the components and
their clients read from it: the PKI, the static tokens, the audit policy, the admission configuration, the
kubeconfigs and kubectl.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import yaml

from gpustack_models.local import pki
from gpustack_models.local.ports import Ports

SERVICE_IP = "10.96.0.1"
AUDITED_GROUPS = ("worker.gpustack.ai", "authentication.k8s.io", "authorization.k8s.io")
TENANT_USERS = ("alice", "bob", "carol", "dave", "erin")
TENANT_GROUP = "gpustack:tenants"
# The user kube-apiserver authenticates as when it calls an admission webhook (client certificate
# ``pki/webhook-client.crt``, no group), so a webhook can tell kube-apiserver from anyone else.
WEBHOOK_CLIENT_USER = "kube-apiserver-admission"
# Client certificates signed by the cluster CA: file name -> (user, groups).
CLIENT_CERTS = {
    "admin": ("kubernetes-admin", ("system:masters",)),
    # The bootstrap RBAC binds system:kube-scheduler and system:volume-scheduler to this user.
    "kube-scheduler": ("system:kube-scheduler", ()),
    # kube-apiserver's identity towards kubelets (logs, exec, port-forward), authorized by their webhook.
    "kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
    "webhook-client": (WEBHOOK_CLIENT_USER, ()),
}


class StateDir:
    """The state directory ``state_dir`` of a cluster on ``ports`` that advertises ``advertise_address``."""

    def __init__(self, state_dir: Path, ports: Ports, advertise_address: str):
        self.state_dir = state_dir
        self.ports = ports
        self.advertise_address = advertise_address
        self.pki_dir = self.state_dir / "pki"
        self.log_dir = self.state_dir / "logs"
        self.audit_log = self.state_dir / "audit" / "audit.log"
        self.kubeconfig = self.state_dir / "kubeconfig"
        self.scheduler_kubeconfig = self.state_dir / "scheduler-kubeconfig"
        self.token_kubeconfig = self.state_dir / "token-kubeconfig"
        self.kubectl = self.state_dir / "bin" / "kubectl"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def tokens(self) -> dict[str, str]:
        return json.loads((self.state_dir / "tokens.json").read_text())

    def pki_path(self, name: str) -> Path:
        return self.pki_dir / name

    def prepare(self, bin_dir: Path) -> None:
        """PKI, token file, audit policy, admission config, kubeconfigs and kubectl (from ``bin_dir``); see
        ``LocalCluster.prepare``."""
        for sub in (self.pki_dir, self.log_dir, self.audit_log.parent, self.kubectl.parent):
            sub.mkdir(parents=True, exist_ok=True)
        self._ensure_pki()
        if not (self.state_dir / "tokens.json").exists():
            self._write_tokens()
        self._write_audit_policy()
        self._write_admission_config()
        self._write_kubeconfig()
        self.write_kubeconfig(
            self.scheduler_kubeconfig, self.pki_path("kube-scheduler.crt"), self.pki_path("kube-scheduler.key")
        )
        if self.kubectl.is_symlink() or self.kubectl.exists():
            self.kubectl.unlink()
        self.kubectl.symlink_to(bin_dir / "kubectl")

    def _ensure_ca(self, name: str, common_name: str) -> tuple[pki.KeyPair, bool]:
        """The CA ``name`` of the state directory, created when missing; and whether it is new."""
        if (self.pki_dir / f"{name}.crt").exists() and (self.pki_dir / f"{name}.key").exists():
            return pki.KeyPair.load(self.pki_dir, name), False
        ca = pki.new_ca(common_name)
        ca.write(self.pki_dir, name)
        return ca, True

    def _missing(self, name: str, reissue: bool) -> bool:
        return reissue or not (self.pki_dir / f"{name}.crt").exists() or not (self.pki_dir / f"{name}.key").exists()

    def _ensure_pki(self) -> None:
        d = self.pki_dir
        ca, new = self._ensure_ca("ca", "gpustack-models-local-ca")
        if self._missing("apiserver", new):
            pki.issue(
                ca,
                "kube-apiserver",
                dns_names=(
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ),
                ip_addresses=("127.0.0.1", SERVICE_IP, self.advertise_address),
                server=True,
            ).write(d, "apiserver")
        for name, (user, groups) in CLIENT_CERTS.items():
            if self._missing(name, new):
                pki.issue(ca, user, organizations=groups, client=True).write(d, name)
        front_proxy_ca, new = self._ensure_ca("front-proxy-ca", "gpustack-models-front-proxy-ca")
        if self._missing("front-proxy-client", new):
            pki.issue(front_proxy_ca, "front-proxy-client", client=True).write(d, "front-proxy-client")
        if not (d / "sa.key").exists() or not (d / "sa.pub").exists():
            pki.new_signing_key(d, "sa")

    def _write_tokens(self) -> None:
        tokens = {user: secrets.token_urlsafe(24) for user in TENANT_USERS}
        lines = [f'{token},{user},uid-{user},"{TENANT_GROUP}"' for user, token in tokens.items()]
        (self.state_dir / "tokens.csv").write_text("\n".join(lines) + "\n")
        (self.state_dir / "tokens.csv").chmod(0o600)
        (self.state_dir / "tokens.json").write_text(json.dumps(tokens, indent=2))
        (self.state_dir / "tokens.json").chmod(0o600)

    def _write_audit_policy(self) -> None:
        policy = {
            "apiVersion": "audit.k8s.io/v1",
            "kind": "Policy",
            "omitStages": ["RequestReceived"],
            "rules": [
                # Whose access a SubjectAccessReview asked about is in its body: tests match the caller.
                {
                    "level": "Request",
                    "resources": [{"group": "authorization.k8s.io", "resources": ["subjectaccessreviews"]}],
                },
                {"level": "Metadata", "resources": [{"group": g} for g in AUDITED_GROUPS]},
                {"level": "None"},
            ],
        }
        (self.state_dir / "audit-policy.yaml").write_text(yaml.safe_dump(policy))

    def _write_admission_config(self) -> None:
        """kube-apiserver presents ``pki/webhook-client.crt`` to every admission webhook ("*")."""
        kubeconfig = self.state_dir / "admission-kubeconfig"
        user = {"client-certificate": str(self.pki_path("webhook-client.crt"))}
        user["client-key"] = str(self.pki_path("webhook-client.key"))
        kubeconfig.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]})
        )
        webhook = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig),
        }
        config = {
            "apiVersion": "apiserver.config.k8s.io/v1",
            "kind": "AdmissionConfiguration",
            "plugins": [
                {"name": name, "configuration": webhook}
                for name in ("MutatingAdmissionWebhook", "ValidatingAdmissionWebhook")
            ],
        }
        (self.state_dir / "admission-config.yaml").write_text(yaml.safe_dump(config))

    def write_kubeconfig(self, path: Path, cert: Path, key: Path, user: str = "admin") -> Path:
        """A kubeconfig for this cluster that authenticates with the client certificate ``cert``/``key``."""
        import base64

        def b64(file: Path) -> str:
            return base64.b64encode(file.read_bytes()).decode()

        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "local",
                    "cluster": {"server": self.server, "certificate-authority-data": b64(self.pki_path("ca.crt"))},
                }
            ],
            "users": [{"name": user, "user": {"client-certificate-data": b64(cert), "client-key-data": b64(key)}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
            "current-context": "local",
        }
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def _write_kubeconfig(self) -> None:
        self.write_kubeconfig(self.kubeconfig, self.pki_path("admin.crt"), self.pki_path("admin.key"))
        # The same cluster with no credentials, for clients that bring a bearer token (--token).
        anonymous = yaml.safe_load(self.kubeconfig.read_text())
        anonymous["users"] = [{"name": "token", "user": {}}]
        anonymous["contexts"] = [{"name": "local", "context": {"cluster": "local", "user": "token"}}]
        self.token_kubeconfig.write_text(yaml.safe_dump(anonymous))
