"""Talking to the test control plane: kubectl, HTTP sessions, and writes that retry on conflicts."""

from __future__ import annotations

import json
import subprocess

import requests
from kubernetes import client as k8s

from gpustack_models import kube
from gpustack_models.local.cluster import LocalCluster
from tests.support.waiting import wait_for


def wait_default_service_account(admin: kube.Kube, namespace: str) -> None:
    """Until ``namespace``'s default ServiceAccount exists: kube-apiserver refuses Pods before it does."""

    def exists():
        try:
            return admin.get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
        except kube.NotFound:
            return None

    wait_for(exists, timeout=30, message=f"the default ServiceAccount of {namespace}")


def kubectl_run(lc: LocalCluster, *args: str, token: str | None = None, check=True, input=None, cache_dir=None):
    """Run the cluster's own kubectl; returns the CompletedProcess (text)."""
    kubeconfig = lc.token_kubeconfig if token else lc.kubeconfig
    cmd = [str(lc.kubectl), f"--kubeconfig={kubeconfig}"]
    if cache_dir:
        cmd.append(f"--cache-dir={cache_dir}")
    if token:
        cmd.append(f"--token={token}")
    proc = subprocess.run(cmd + list(args), capture_output=True, text=True, input=input, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def token_http(cluster: LocalCluster, token: str) -> requests.Session:
    session = requests.Session()
    session.trust_env = False
    session.verify = str(cluster.pki_path("ca.crt"))
    session.headers["Authorization"] = f"Bearer {token}"
    session.base = cluster.server
    return session


def read_modify_write(session, target, change, attempts=20):
    """PUT ``change(current)`` with a requests session until no concurrent writer (the worker or a plugin,
    writing status) got in between (409 Conflict). Returns the last response."""
    import copy

    for _ in range(attempts):
        current = session.get(target).json()
        resp = session.put(target, json=change(copy.deepcopy(current)))
        if resp.status_code != 409:
            return resp
    raise AssertionError(f"PUT {target} still conflicting after {attempts} attempts")


def kube_update(client, path, change, attempts=20):
    """The same with a ``gpustack_models.kube.Kube`` client; returns the written object."""
    from gpustack_models import kube

    for _ in range(attempts):
        current = client.get(path)
        try:
            return client.json("PUT", path, body=change(current))
        except kube.Conflict:
            continue
    raise AssertionError(f"PUT {path} still conflicting after {attempts} attempts")


def status_of(exc: k8s.ApiException) -> dict:
    return json.loads(exc.body)
