"""Front-proxy identity headers and certificates, as kube-apiserver's aggregator sends them."""

import datetime

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gpustack_models.api.authentication import RequestHeaderConfig, make_user, user_from_headers
from gpustack_models.local import pki

CONFIG = RequestHeaderConfig()


def test_it_reads_one_group_per_header_line_even_with_commas():
    headers = [
        ("x-remote-user", "alice"),
        ("x-remote-group", "team-a,ops"),
        ("x-remote-group", "system:authenticated"),
        ("x-remote-uid", "u-1"),
        ("x-remote-extra-authentication.kubernetes.io%2Fnode-name", "node-1"),
        ("x-remote-extra-scopes", "a"),
        ("x-remote-extra-Scopes", "b"),
    ]
    user = user_from_headers(headers, CONFIG)
    assert user.username == "alice" and user.uid == "u-1"
    assert user.groups == ("team-a,ops", "system:authenticated")
    assert user.extra_dict == {"authentication.kubernetes.io/node-name": ["node-1"], "scopes": ["a", "b"]}


def test_it_takes_the_first_user_and_adds_system_authenticated():
    user = user_from_headers([("x-remote-user", "bob"), ("x-remote-user", "mallory")], CONFIG)
    assert user.username == "bob" and user.groups == ("system:authenticated",)
    assert user_from_headers([("x-remote-group", "admins")], CONFIG) is None
    assert make_user("system:anonymous").groups == ()


def test_it_reads_the_header_names_the_configmap_gives():
    config = RequestHeaderConfig.from_configmap(
        {"data": {"requestheader-username-headers": '["X-User"]', "requestheader-group-headers": '["X-Group"]'}}
    )
    user = user_from_headers([("x-user", "carol"), ("x-group", "g"), ("x-remote-user", "ignored")], config)
    assert user.username == "carol" and "g" in user.groups


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.DER)


def test_it_trusts_only_allowed_names_issued_by_the_requestheader_ca():
    front, other = pki.new_ca("front-proxy-ca"), pki.new_ca("client-ca")
    config = RequestHeaderConfig(ca_certs=[front.cert], allowed_names=["front-proxy-client"])
    good = pki.issue(front, "front-proxy-client", client=True)
    assert config.verify_front_proxy(der(good.cert))
    assert not config.verify_front_proxy(der(pki.issue(front, "someone-else", client=True).cert))
    assert not config.verify_front_proxy(der(pki.issue(other, "front-proxy-client", client=True).cert))
    assert not config.verify_front_proxy(b"not a certificate")
    yesterday = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    expired = pki.issue(
        front, "front-proxy-client", client=True, not_before=yesterday, validity=datetime.timedelta(hours=1)
    )
    assert not config.verify_front_proxy(der(expired.cert))


def test_a_client_certificate_s_user_is_kept_only_while_the_client_ca_and_the_certificate_hold(monkeypatch):
    from gpustack_models.api import authentication

    old_ca, new_ca = pki.new_ca("client-ca"), pki.new_ca("client-ca-rotated")
    pem = old_ca.cert.public_bytes(serialization.Encoding.PEM).decode()
    source = authentication.RequestHeaderSource()
    source._set(RequestHeaderConfig(client_ca_pem=pem, resource_version="1"))
    caller = der(pki.issue(old_ca, "system:kube-apiserver", client=True).cert)
    forged = der(pki.issue(new_ca, "system:kube-apiserver", client=True).cert)
    assert source.certificate_user(caller).username == "system:kube-apiserver"
    assert source.certificate_user(caller).username == "system:kube-apiserver"  # from the cache
    assert source.certificate_user(forged) is None and source.certificate_user(forged) is None
    rotated = new_ca.cert.public_bytes(serialization.Encoding.PEM).decode()
    source._set(RequestHeaderConfig(client_ca_pem=rotated, resource_version="2"))  # the old CA is no longer trusted
    assert source.certificate_user(caller) is None and source.certificate_user(forged).username
    config = source.current()
    checked = []
    real = config.client_certificate_user
    monkeypatch.setattr(config, "client_certificate_user", lambda d: checked.append(d) or real(d))
    short = der(pki.issue(new_ca, "short-lived", client=True, validity=datetime.timedelta(minutes=10)).cert)
    assert source.certificate_user(short).username == "short-lived" and source.certificate_user(short).username
    assert checked == [short]  # checked once
    ends = x509.load_der_x509_certificate(short).not_valid_after_utc.timestamp()
    monkeypatch.setattr(authentication.time, "time", lambda: ends + 1)  # past the certificate's end
    source.certificate_user(short)
    assert checked == [short, short]  # checked again, not taken from the cache
