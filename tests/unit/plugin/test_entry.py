"""``python -m gpustack_models.plugin``: a setting it cannot start with stops it at once with exit status 2 and
one line naming the variable, before it talks to anyone."""

import os
import subprocess
import sys

from tests.support.paths import REPO


def start(tmp_path, **env) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_") and k != "KUBECONFIG"}
    base.pop("KUBERNETES_SERVICE_HOST", None)
    env = base | {"GPUSTACK_DATA_DIR": str(tmp_path)} | env
    argv = [sys.executable, "-m", "gpustack_models.plugin", "--node=n1"]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_a_malformed_variable_is_named(tmp_path):
    proc = start(tmp_path, GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS="many")
    assert proc.returncode == 2, proc.stderr
    assert "ImproperlyConfigured: GPUSTACK_PLUGIN_PEER_MAX_CONNECTIONS='many': expected an integer" in proc.stderr


def test_no_certificate_and_none_asked_of_the_api(tmp_path):
    proc = start(tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "GPUSTACK_PLUGIN_TLS_CERT_FILE and GPUSTACK_PLUGIN_TLS_KEY_FILE are required" in proc.stderr


def test_no_credentials_for_kube_apiserver(tmp_path):
    proc = start(tmp_path, GPUSTACK_PLUGIN_CERT_FROM_API="true", KUBECONFIG=str(tmp_path / "absent"))
    assert proc.returncode == 2, proc.stderr
    assert f"CredentialsError: {tmp_path / 'absent'}" in proc.stderr


def test_a_hostile_kubeconfig_asking_to_run_a_command_is_refused(tmp_path):
    config = tmp_path / "kubeconfig"
    config.write_text(
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {exec: {command: /bin/sh, args: [-c, 'touch pwned']}}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
    )
    proc = start(tmp_path, GPUSTACK_PLUGIN_CERT_FROM_API="true", KUBECONFIG=str(config))
    assert proc.returncode == 2 and "users[].user.exec is not supported" in proc.stderr, proc.stderr
    assert not (tmp_path / "pwned").exists() and not (REPO / "pwned").exists()
