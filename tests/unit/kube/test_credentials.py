"""The node plugin's own credential loader (``kube.credentials``): the kubeconfig forms its launcher and chart
give it, the Pod's ServiceAccount with a rotating token, and a clear refusal of everything else."""

import base64
import stat
from pathlib import Path

import pytest
import yaml

from gpustack_models.kube import credentials
from gpustack_models.kube.credentials import CredentialsError, from_kubeconfig, in_cluster


def kubeconfig(tmp_path: Path, user: dict, cluster: dict | None = None, current: str = "ctx") -> Path:
    cluster = cluster or {"server": "https://127.0.0.1:6443/", "certificate-authority": "ca.crt"}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": current,
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_token_and_a_ca_relative_to_the_file(tmp_path):
    got = from_kubeconfig(kubeconfig(tmp_path, {"token": "abc"}))
    assert got.host == "https://127.0.0.1:6443"
    assert got.ca_file == str(tmp_path / "ca.crt") and got.verify
    assert got.auth_headers() == {"Authorization": "Bearer abc"}
    assert got.cert_file is None and got.key_file is None


def test_a_client_certificate_given_as_data_is_written_for_this_process_alone(tmp_path):
    user = {
        "client-certificate-data": base64.b64encode(b"CERT").decode(),
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }
    ca = {"server": "https://h:1", "certificate-authority-data": base64.b64encode(b"CA").decode()}
    got = from_kubeconfig(kubeconfig(tmp_path, user, ca))
    assert Path(got.cert_file).read_bytes() == b"CERT" and Path(got.key_file).read_bytes() == b"KEY"
    assert Path(got.ca_file).read_bytes() == b"CA"
    assert got.auth_headers() == {}
    for name in (got.key_file, Path(got.key_file).parent):
        mode = stat.S_IMODE(Path(name).stat().st_mode)
        assert mode & 0o077 == 0, oct(mode)  # no one but the process's user reads the key


def test_a_token_file_is_read_again_once_it_may_have_rotated(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("first\n")
    got = from_kubeconfig(kubeconfig(tmp_path, {"tokenFile": "token"}))
    assert got.auth_headers() == {"Authorization": "Bearer first"}
    token.write_text("second\n")
    assert got.auth_headers() == {"Authorization": "Bearer first"}  # within the reread period
    clock = credentials.time.monotonic() + credentials.TOKEN_REREAD_SECONDS + 1
    monkeypatch.setattr(credentials.time, "monotonic", lambda: clock)
    assert got.auth_headers() == {"Authorization": "Bearer second"}


@pytest.mark.parametrize("key", ["exec", "auth-provider", "username", "password"])
def test_a_credential_form_it_does_not_speak_is_refused_by_name(tmp_path, key):
    with pytest.raises(CredentialsError, match=f"users\\[\\].user.{key} is not supported"):
        from_kubeconfig(kubeconfig(tmp_path, {key: {"command": "steal-a-token"} if key == "exec" else "x"}))


def test_a_missing_context_cluster_or_server_names_the_file_and_field(tmp_path):
    with pytest.raises(CredentialsError, match="contexts: no entry named 'other'"):
        from_kubeconfig(kubeconfig(tmp_path, {"token": "t"}, current="other"))
    with pytest.raises(CredentialsError, match="server: Required value"):
        from_kubeconfig(kubeconfig(tmp_path, {"token": "t"}, {"certificate-authority": "ca.crt"}))
    with pytest.raises(CredentialsError, match=str(tmp_path / "missing")):
        from_kubeconfig(tmp_path / "missing")
    (tmp_path / "bad").write_text("clusters: [unclosed")
    with pytest.raises(CredentialsError, match="bad"):
        from_kubeconfig(tmp_path / "bad")


def test_in_a_pod_the_service_account_and_the_service_address(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("sa-token")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    got = in_cluster(tmp_path)
    assert got.host == "https://[fd00::1]:443" and got.ca_file == str(tmp_path / "ca.crt")
    assert got.auth_headers() == {"Authorization": "Bearer sa-token"}
    (tmp_path / "token").unlink()
    with pytest.raises(CredentialsError, match="no ServiceAccount token"):
        in_cluster(tmp_path)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(CredentialsError, match="KUBERNETES_SERVICE_PORT"):
        in_cluster(tmp_path)


def test_with_token_keeps_the_server_and_ca_and_drops_the_certificate(tmp_path):
    got = from_kubeconfig(kubeconfig(tmp_path, {"client-certificate": "c.crt", "client-key": "c.key"}))
    tenant = got.with_token("tenant")
    assert (tenant.host, tenant.ca_file, tenant.cert_file) == (got.host, got.ca_file, None)
    assert tenant.auth_headers() == {"Authorization": "Bearer tenant"}
