"""The four components of the local control plane: their binaries, built from the Kubernetes Go modules
by ``deploy/controlplane/build.sh`` into a cache outside the repository, and their command lines.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpustack_models.local.ports import Ports
from gpustack_models.local.statedir import StateDir

REPO_DIR = Path(__file__).resolve().parents[2]
CONTROLPLANE_DIR = REPO_DIR / "deploy" / "controlplane"
SERVICE_CIDR = "10.96.0.0/16"
CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    # Remove the kubernetes.io/pvc-protection and pv-protection finalizers once nothing uses the object
    # (without them deleting a PersistentVolumeClaim never completes).
    "persistentvolumeclaim-protection-controller",
    "persistentvolume-protection-controller",
    # Deletes Pods bound to a Node that no longer exists, and terminated Pods beyond a threshold.
    "pod-garbage-collector-controller",
    # The chart's plugin DaemonSet on a real node (a DaemonSet's Pods go only where its selector says).
    "daemonset-controller",
    # The whole chart on a real node: its Deployments, its migrate and hook Jobs, the API Service's
    # endpoints (kube-apiserver's APIService availability check reads them) and its PodDisruptionBudgets
    # (an eviction is refused by a budget only while the disruption controller keeps its status).
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "disruption-controller",
    # Type-checks the admission policies and reports it in their status (observedGeneration, warnings): the
    # launcher waits for that before it calls the policies installed.
    "validatingadmissionpolicy-status-controller",
)


def kube_version() -> str:
    """The Kubernetes version pinned in the control plane's go.mod (the one place it is pinned)."""
    match = re.search(
        r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v1\.\S+)", (CONTROLPLANE_DIR / "go.mod").read_text(), re.M
    )
    if match:
        return match.group(1)
    raise RuntimeError("no k8s.io/kubernetes version in deploy/controlplane/go.mod")


def ensure_binaries() -> Path:
    """Build (or reuse) the control plane binaries; returns their directory. Progress goes to stderr."""
    proc = subprocess.run([str(CONTROLPLANE_DIR / "build.sh")], stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"building the control plane failed (exit {proc.returncode}); see the output above")
    return Path(proc.stdout.strip().splitlines()[-1])


@dataclass
class CommandLines:
    """The command lines of etcd, kube-apiserver, kube-scheduler and kube-controller-manager: binaries in
    ``bin_dir``, their files in ``files``."""

    files: StateDir
    bin_dir: Path
    ports: Ports
    advertise_address: str
    compaction_interval: str

    def etcd(self) -> list[str]:
        p = self.ports
        return [
            str(self.bin_dir / "etcd"),
            "--name=local",
            f"--data-dir={self.files.state_dir / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--advertise-client-urls=http://127.0.0.1:{p.etcd_client}",
            f"--listen-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{p.etcd_peer}",
            f"--initial-cluster=local=http://127.0.0.1:{p.etcd_peer}",
            "--log-level=warn",
            "--quota-backend-bytes=4294967296",
        ]

    def apiserver(self) -> list[str]:
        d, p = self.files.pki_dir, self.ports
        return [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{p.etcd_client}",
            f"--etcd-compaction-interval={self.compaction_interval}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.apiserver}",
            f"--advertise-address={self.advertise_address}",
            "--endpoint-reconciler-type=none",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--cert-dir={self.files.state_dir / 'apiserver-certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--token-auth-file={self.files.state_dir / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            f"--requestheader-client-ca-file={d / 'front-proxy-ca.crt'}",
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-uid-headers=X-Remote-Uid",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
            f"--proxy-client-cert-file={d / 'front-proxy-client.crt'}",
            f"--proxy-client-key-file={d / 'front-proxy-client.key'}",
            f"--audit-policy-file={self.files.state_dir / 'audit-policy.yaml'}",
            f"--audit-log-path={self.files.audit_log}",
            "--audit-log-format=json",
            "--audit-log-maxsize=200",
            "--audit-log-maxbackup=2",
            "--profiling=false",
            "--v=1",
            *self._apiserver_node(),
        ]

    def _apiserver_node(self) -> list[str]:
        """What a real kubelet needs: kubelets authorized the real way (a ``system:node:<name>`` certificate
        in ``system:nodes``, limited to its own Node and Pods), a client certificate towards kubelets, their
        InternalIP dialled rather than their (unresolvable) names, and privileged containers allowed."""
        d = self.files.pki_dir
        return [
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            f"--admission-control-config-file={self.files.state_dir / 'admission-config.yaml'}",
            "--allow-privileged=true",
            "--kubelet-preferred-address-types=InternalIP,Hostname",
            f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
            f"--kubelet-client-key={d / 'kubelet-client.key'}",
            # Kubelets serve with a certificate of the cluster CA (the test suite's does).
            f"--kubelet-certificate-authority={d / 'ca.crt'}",
        ]

    def scheduler(self) -> list[str]:
        return [
            str(self.bin_dir / "kube-scheduler"),
            f"--kubeconfig={self.files.scheduler_kubeconfig}",
            "--leader-elect=false",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports.scheduler}",
            f"--cert-dir={self.files.state_dir / 'scheduler-certs'}",
            "--profiling=false",
            "--v=1",
        ]

    def controller_manager(self) -> list[str]:
        d, p = self.files.pki_dir, self.ports
        return [
            str(self.bin_dir / "kube-controller-manager"),
            f"--kubeconfig={self.files.kubeconfig}",
            f"--controllers={','.join(CONTROLLERS)}",
            "--leader-elect=false",
            "--use-service-account-credentials=false",
            f"--root-ca-file={d / 'ca.crt'}",
            "--bind-address=127.0.0.1",
            f"--secure-port={p.controller_manager}",
            f"--cert-dir={self.files.state_dir / 'controller-manager-certs'}",
            "--authentication-skip-lookup=true",
            "--profiling=false",
            "--v=1",
        ]
